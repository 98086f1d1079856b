"""The watchdog: a wait on another process that makes no progress is named, then ended.

Every wait of a run on another process is a :class:`Watch`: who waits (the trainer), on whom
(the orchestrator, vf-vllm), for what (batch 3, a weight push), and a ``look`` that asks the
other side how it stands. The waiter calls :meth:`Watch.check` about once a second; every
``period_s`` the watch looks (in a daemon thread, so that a stopped process cannot block the
waiter: ``answer_s`` seconds, then "no answer"). A look whose ``progress`` differs from the last
one (rollouts done, tokens generated) starts the quiet clock again, so a long but moving wait is
never stopped. After ``limits.warning_s`` seconds without progress one line goes to stdout (the
pane and its log), with a state asked for after the limit passed; after ``limits.stop_s`` the
wait raises :class:`Stalled` with the line, which the trainer turns into its reason to stop
(with a checkpoint, ``trainer/checkpoints.py``).

Lines read ``[vf-rl] watchdog: <who> has waited <t> s on <whom> for <what>, no progress for <q> s;
<the other side's state>``. The limits are the trainer keys ``stall_warning_timeout`` and
``stall_timeout``; docs/faults.md lists every wait and what its line shows.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, Hashable

PREFIX = "[vf-rl] watchdog:"


@dataclass(frozen=True)
class Limits:
    """Seconds a wait may go without progress: ``warning_s`` before its line is printed,
    ``stop_s`` before it raises :class:`Stalled` (``stall_warning_timeout``, ``stall_timeout``)."""

    warning_s: float
    stop_s: float

    @classmethod
    def of(cls, args) -> Limits:
        """The limits of a run's arguments (an ``RLConfig`` or ``OrchestratorConfig``)."""
        return cls(float(args.stall_warning_timeout), float(args.stall_timeout))


class Stalled(RuntimeError):
    """A wait made no progress for its stop limit. ``str()`` is the watchdog's line (one line);
    it pickles, so the orchestrator's process can raise it to the trainer."""


@dataclass(frozen=True)
class Look:
    """What the other side said: ``progress``, any value that changes whenever it moved on
    (compared with ``==``), and ``state``, its state in words for the line."""

    progress: Hashable
    state: str


class Watch:
    """One wait, watched (see the module docstring).

    Args:
        who, whom: the waiting side and the side waited on, in words ("the trainer", "vf-vllm").
        what: what is waited for ("batch 3").
        look: asks the other side; may block (it runs in a daemon thread) or raise (its error
            becomes the state).
        limits: :class:`Limits`.
        period_s: seconds between looks.
        answer_s: seconds a look may take before the state reads "no answer".
        printer: where the warning line goes (default ``print``, flushed).
        ending: what the stop does, for its line ("stopping the run").
    """

    def __init__(self, who: str, whom: str, what: str, look: Callable[[], Look], limits: Limits,
                 period_s: float = 5.0, answer_s: float = 10.0, printer: Callable[[str], None] | None = None,
                 ending: str = "stopping the run"):
        self.who, self.whom, self.what, self.limits = who, whom, what, limits
        self._look, self.period_s, self.answer_s = look, period_s, answer_s
        self._print = printer or (lambda line: print(line, flush=True))
        self.ending = ending
        self.started = self.quiet_since = time.monotonic()
        self._progress: object = _UNSET
        self._state = "not asked yet"
        self._asking: Future | None = None
        self._asked_at = self._state_at = -float("inf")  # when the last look began; when the state was known
        self._warned = False

    def check(self) -> None:
        """Look when due; past ``warning_s`` without progress, print the line once (with a state
        asked for after that limit was passed, or "no answer").

        Raises:
            Stalled: no progress for ``stop_s`` seconds; its message is the line.
        """
        now = time.monotonic()
        if self._asking is not None and self._asking.done():
            self._take(self._asking)
            self._asking = None
        elif self._asking is not None and now - self._asked_at > self.answer_s:
            self._state = f"{self.whom} gave no answer in {now - self._asked_at:.0f} s (stopped or hung)"
            self._state_at = now
        quiet = now - self.quiet_since
        warn = not self._warned and quiet >= self.limits.warning_s
        stop = quiet >= self.limits.stop_s
        # a line carries a state asked for after its limit passed (or "no answer")
        warn_known = warn and self._state_at >= self.quiet_since + self.limits.warning_s
        stop_known = stop and self._state_at >= self.quiet_since + self.limits.stop_s
        if self._asking is None and (now - self._asked_at >= self.period_s or (warn and not warn_known)
                                     or (stop and not stop_known)):
            self._asked_at, self._asking = now, in_daemon(self._look)
        if warn_known:
            self._warned = True
            self._print(self.line())
        if stop_known:
            raise Stalled(self.line(stopping=True))

    def _take(self, asked: Future) -> None:
        self._state_at = self._asked_at
        try:
            look = asked.result()
        except Exception as exc:  # the look itself failed: say so, count no progress
            self._state = f"asking {self.whom} failed: {type(exc).__name__}: {exc}"
            return
        if look.progress != self._progress:
            if self._progress is not _UNSET:
                self.quiet_since = self._asked_at
            self._progress = look.progress
        self._state = look.state

    def line(self, stopping: bool = False) -> str:
        """The watchdog's line about this wait, as of now (one line)."""
        now = time.monotonic()
        head = f"{self.ending}: " if stopping else ""
        tail = "" if stopping else f" ({self.ending} after {self.limits.stop_s:.0f} s without progress: stall_timeout)"
        return (f"{PREFIX} {head}{self.who} has waited {now - self.started:.0f} s on {self.whom} for {self.what}, "
                f"no progress for {now - self.quiet_since:.0f} s; {self._state}{tail}").replace("\n", " ")


_UNSET = object()


def in_daemon(call: Callable[[], object]) -> Future:
    """``call()`` in a daemon thread; its ``concurrent.futures.Future``. For a call that may
    block on a stopped peer: a thread stuck there never holds up the process's exit (a
    ``ThreadPoolExecutor``'s threads are joined at exit)."""
    future: Future = Future()

    def run():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

    threading.Thread(target=run, name="vf-rl-watchdog-look", daemon=True).start()
    return future


def wait_watched(future: Future, watch: Watch | None, poll_s: float = 1.0):
    """``future.result()``, calling ``watch.check()`` about every ``poll_s`` seconds meanwhile.

    Raises:
        Stalled: from the watch; the future is left as it is (its thread may stay blocked).
        whatever the future raises.
    """
    if watch is None:
        return future.result()
    while True:
        try:
            return future.result(timeout=poll_s)
        except FutureTimeout:
            watch.check()
