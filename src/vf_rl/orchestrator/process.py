"""The orchestrator in its own process, so that the trainer's Python does not slow the rollouts.

A training step holds the trainer process's GIL most of the time (kernel launches, the
optimizer, batching). An orchestrator thread in that process waits for it at every socket read
and parse, and the rollout path is host-bound: one busy Python thread beside the rollout client
costs generation much of its pace (``docs/benchmarks.md``, the request-path probe). Here the
:class:`~vf_rl.orchestrator.orchestrator.Orchestrator` runs in a process started with ``spawn``
(a ``multiprocessing`` manager: each call from the trainer is a request to that process), with
the same methods. The environment is rebuilt there from the recipe ``load_environment`` gives it
(``env.recipe``), or unpickled when it has none.

The weight-sync gate stays in the trainer: a batch submitted ``after`` a weight push is sent
to the process only once the push is done.

The trainer's waits on the process are watched (``watch.py``): its look asks the process for its
state, and a process that does not answer (stopped, hung) counts as no progress. Closing it
kills a process that does not answer.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from multiprocessing.managers import BaseManager, RemoteError
from typing import Callable

from vf_rl.config.sections import OrchestratorConfig
from vf_rl.env_api import Environment, Rollout
from vf_rl.orchestrator.orchestrator import INTERFACE, Batch, Orchestrator, report_progress, weights_lost_line
from vf_rl.orchestrator.watch import EVAL, orchestrator_watch
from vf_rl.parent_watch import kill_children, start_parent_watch
from vf_rl.watchdog import Limits, in_daemon, wait_watched

CLOSE_S = 30.0
"""Seconds the process may take to close before it is killed (it does not answer: stopped, hung)."""


def env_source(env: Environment, options: dict | None = None):
    """What rebuilds ``env`` in another process: its ``recipe`` (a picklable zero-argument
    callable that ``load_environment`` attaches), else ``env`` itself if it pickles; ``None``
    when neither, or when it or the orchestrator's ``options`` do not pickle or name something
    of ``__main__`` (a class or function of the running script, which the orchestrator's
    process does not import): the orchestrator then stays a thread in the trainer."""
    source = getattr(env, "recipe", None) or env
    return source if _sendable(source) and _sendable(options) else None


def _sendable(value) -> bool:
    try:
        return b"__main__" not in pickle.dumps(value)
    except Exception:
        return False


@contextlib.contextmanager
def _main_script_hidden():
    """While a process is spawned: hide the running script from ``multiprocessing``, which
    would run its top level again in the new process (as ``__mp_main__``); a training script
    without an ``if __name__ == "__main__":`` guard would start training there too. The
    orchestrator's process needs nothing from ``__main__`` (:func:`env_source`)."""
    main = sys.modules["__main__"]
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.update(dict.fromkeys(saved))
    try:
        yield
    finally:
        main.__dict__.update(saved)


def with_picklable_state(rollouts: list[Rollout]) -> list[Rollout]:
    """``rollouts`` with each ``state`` cut to the entries that pickle (an environment may keep
    live objects there: clients, sandboxes), so that they can be sent to the trainer."""
    for rollout in rollouts:
        try:
            pickle.dumps(rollout.state)
        except Exception:
            rollout.state = {k: v for k, v in rollout.state.items() if _pickles(v)}
    return rollouts


def _pickles(value) -> bool:
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


class HostedOrchestrator(Orchestrator):
    """The orchestrator as its process holds it (the trainer calls :data:`INTERFACE` on it): the
    rollouts it returns carry only state that pickles, and closing it stops what the environment
    started there. Its waits are not watched here: the trainer, which waits on it, watches them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = None

    def wait(self, step: int, on_progress=None) -> Batch:
        batch = super().wait(step)
        batch.rollouts = with_picklable_state(batch.rollouts)
        return batch

    def run(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        return with_picklable_state(super().run(rows, rollouts_per_example))

    def close(self) -> None:
        super().close()
        kill_children()  # what the environment started (a process pool) would outlive this process


_prepared: tuple[Environment, list[dict]] | BaseException | None = None


def _build(source, rows: list[dict]) -> None:
    """The manager process's initializer, run in its main thread (environments may install signal
    handlers, which only the main thread can): watch the trainer, rebuild the environment, keep
    it, or the error, for :func:`_host`."""
    global _prepared
    start_parent_watch()
    try:
        _prepared = (source if isinstance(source, Environment) else source(), rows)
    except BaseException as exc:  # raised to the trainer by _host, with this process's traceback
        _prepared = exc


def _host(kwargs: dict) -> HostedOrchestrator:
    if isinstance(_prepared, BaseException):
        raise _prepared
    return HostedOrchestrator(*_prepared, **kwargs)


class _Manager(BaseManager):
    pass


_Manager.register("HostedOrchestrator", _host, exposed=INTERFACE)


class OrchestratorProcess:
    """:class:`~vf_rl.orchestrator.orchestrator.Orchestrator`'s interface, served by another process,
    in two parts: creating it starts the process, which imports vf-rl and rebuilds the
    environment (seconds: the trainer does it while the inference server starts), and
    :meth:`start` builds the orchestrator there once its server is known.

    Args:
        source: from :func:`env_source` (not ``None``).
        rows: training rows, as for ``Orchestrator``.
    """

    def __init__(self, source, rows: list[dict]):
        self._manager = _Manager(ctx=multiprocessing.get_context("spawn"))
        with _main_script_hidden():
            self._manager.start(_build, (source, rows))
        self._remote = None
        self._gates: dict[int, threading.Thread] = {}  # batches waiting for a weight push before they are sent

    def start(self, **kwargs) -> OrchestratorProcess:
        """Build the orchestrator in the process; returns ``self``.

        Args:
            **kwargs: ``Orchestrator``'s keyword arguments (all picklable: the advantage
                function and difficulty filter are sent by reference).
        Raises:
            RuntimeError: the process could not build the orchestrator (the environment failed
                to load there); the message names the cause, and the process is stopped.
        """
        self.batch_size = kwargs["config"].batch_size
        self.limits = Limits.of(kwargs["config"])
        try:
            self._remote = self._manager.HostedOrchestrator(kwargs)
        except Exception as exc:
            self._manager.shutdown()
            raise RuntimeError(f"the orchestrator process could not start: {_last_line(exc)}") from exc
        return self

    def set_active(self, servers) -> None:
        """As ``Orchestrator.set_active``."""
        self._remote.set_active(sorted(servers))

    def submitted(self, step: int) -> bool:
        """As ``Orchestrator.submitted``."""
        return step in self._gates or self._remote.submitted(step)

    def progress(self, step: int) -> int:
        """As ``Orchestrator.progress``."""
        return self._remote.progress(step)

    def state(self, step: int | None) -> dict:
        """As ``Orchestrator.state`` (blocks while the process does not answer)."""
        return self._remote.state(step)

    def _watch(self, step: int | None, what: str):
        return orchestrator_watch(lambda: self._remote.state(step), what, self.limits)

    def submit(self, step: int, policy_step: int | None = None, after: Future | None = None) -> None:
        """As ``Orchestrator.submit``: with a pending ``after``, the batch is sent to the
        orchestrator's process when ``after`` is done; when ``after`` failed, :meth:`wait` sends it."""
        if after is None or (after.done() and after.exception() is None):
            self._remote.submit(step, policy_step)
        elif step not in self._gates:  # pending, or failed (the gate then returns at once)
            def release():
                wait_futures([after])
                if after.exception() is not None:  # not generated now: wait() submits it, after the retry
                    print(weights_lost_line(step), file=sys.stderr, flush=True)
                    return
                with contextlib.suppress(Exception):  # closed meanwhile; else wait() submits it
                    self._remote.submit(step, policy_step)

            self._gates[step] = threading.Thread(target=release, name=f"vf-rl-gate-{step}", daemon=True)
            self._gates[step].start()

    def wait(self, step: int, on_progress: Callable[[int, int], None] | None = None) -> Batch:
        """As ``Orchestrator.wait`` (the same errors, raised here)."""
        if (gate := self._gates.pop(step, None)) is not None:
            gate.join()
        future = in_daemon(lambda: self._remote.wait(step))
        report_progress(future, lambda: self._remote.progress(step), self.batch_size, on_progress,
                        self._watch(step, f"batch {step + 1}"))
        return future.result()

    def wait_idle(self) -> None:
        """As ``Orchestrator.wait_idle``."""
        for gate in list(self._gates.values()):
            gate.join()
        wait_watched(in_daemon(self._remote.wait_idle), self._watch(None, "the batches in flight (before an evaluation)"))

    def run(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        """As ``Orchestrator.run``."""
        return wait_watched(in_daemon(lambda: self._remote.run(rows, rollouts_per_example)),
                            self._watch(EVAL, "the evaluation's rollouts"))

    def close(self) -> None:
        """Stop the orchestrator and its process (killed when it does not close within ``CLOSE_S``)."""
        closing = in_daemon(self._remote.close if self._remote is not None else lambda: None)
        try:
            closing.result(timeout=CLOSE_S)
        except Exception:
            process = getattr(self._manager, "_process", None)  # multiprocessing's own handle of it
            if not closing.done() and process is not None and process.is_alive():
                process.kill()  # it does not answer: a shutdown request would wait for it forever
        self._manager.shutdown()


def _last_line(exc: Exception) -> str:
    """``Type: message`` of ``exc``; for an error raised in the manager's process (a
    ``RemoteError`` carrying that process's traceback as text), the traceback's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip().strip("-")]
    if isinstance(exc, RemoteError) and lines:
        return lines[-1]
    return f"{type(exc).__name__}: {exc}"


def orchestrator_options(args, servers, advantage_fn) -> dict:
    """``Orchestrator``'s keyword arguments from the trainer's ``args`` (an ``RLConfig``: its
    section, ``OrchestratorConfig.from_args``) and its inference ``servers`` (clients with
    ``base_url``), all but ``model_name``, which the weight-sync choice sets once the server answers."""
    return dict(config=OrchestratorConfig.from_args(args), base_url=[f"{server.base_url}/v1" for server in servers],
                advantage_fn=advantage_fn)


def begin_orchestrator(env: Environment, rows: list[dict], **options) -> OrchestratorProcess | None:
    """The orchestrator's process for ``env``, started now (:class:`OrchestratorProcess`), when
    :func:`env_source` can send the environment and ``options`` (the ``Orchestrator`` keyword
    arguments known so far); ``None`` when it cannot, and the orchestrator is to be a thread."""
    source = env_source(env, options)
    return OrchestratorProcess(source, rows) if source is not None else None


def start_orchestrator(env: Environment, rows: list[dict], in_process: bool = True,
                       begun: OrchestratorProcess | None = None, **options):
    """An :class:`OrchestratorProcess` when ``in_process`` and :func:`env_source` can send the
    environment (``begun``: one :func:`begin_orchestrator` started earlier), else an
    :class:`~vf_rl.orchestrator.orchestrator.Orchestrator` thread (with a line saying why, when a
    process was asked for). ``options``: ``Orchestrator``'s keyword arguments."""
    if begun is None and in_process:
        begun = begin_orchestrator(env, rows, **options)
    if begun is not None:
        return begun.start(**options)
    if in_process:
        print("Orchestrator: a thread in the trainer process (the environment or the advantage function is defined "
              "in the running script, or does not pickle)", flush=True)
    return Orchestrator(env, rows, **options)
