"""The trainer's waits on the orchestrator, watched (:mod:`vf_rl.watchdog`).

A wait for a batch (or for the evaluation's rollouts) progresses while rollouts finish, while
the orchestrator's requests are answered, or while vLLM generates tokens (its ``/metrics``
counter): a long generation on a busy server is never taken for a stall. The line names the
orchestrator's state (:meth:`Orchestrator.state`: rollouts done, batches and requests in
flight, the weights the server holds) and each server's, from vLLM's ``/metrics``
(``inference/client.py``: running and waiting requests, or no answer).
"""

from __future__ import annotations

from typing import Callable

from vf_rl.inference.client import ServerLoad, server_load
from vf_rl.watchdog import Limits, Look, Watch

EVAL = -1
"""The step key of the evaluation's rollouts in :meth:`Orchestrator.state` and ``progress``."""


def describe(state: dict, loads: dict[str, ServerLoad | str]) -> str:
    """The orchestrator's ``state`` (:meth:`Orchestrator.state`) and the servers' ``loads``
    (``server_load`` by URL) in words, for the watchdog's line."""
    step = state["step"]
    what = ("rollouts of the batches in flight" if step is None else "evaluation rollouts" if step == EVAL
            else f"rollouts of batch {step + 1}")
    batches = ", ".join(str(s + 1) for s in state["batches"] if s != EVAL) or "none"
    pushed = state["policy_step"]
    weights = ("the server holds the initial weights (no weight push yet)" if not pushed
               else f"the last weight push: the weights after step {pushed}")
    parts = [f"the orchestrator: {state['done']}/{state['total']} {what} done, batches in flight: {batches}, {weights}"]
    for server in state["servers"]:
        quiet = f", none answered for {server['quiet_s']:.0f} s" if server["in_flight"] else ""
        parts.append(f"{server['in_flight']} requests in flight to {server['url']}{quiet}")
    parts += [f"vLLM at {url}: {load}" for url, load in loads.items()]
    return "; ".join(parts)


def root_url(url: str) -> str:
    """A server's root URL from its OpenAI API root (``http://host:port/v1`` -> ``http://host:port``)."""
    return url.rstrip("/").removesuffix("/v1")


def orchestrator_watch(state: Callable[[], dict], what: str, limits: Limits | None) -> Watch | None:
    """The :class:`~vf_rl.watchdog.Watch` of the trainer's wait on the orchestrator for ``what``
    ("batch 3"); ``state`` asks the orchestrator (:meth:`Orchestrator.state`). ``None`` without
    ``limits`` (nothing watched)."""
    if limits is None:
        return None

    def look() -> Look:
        s = state()
        loads = {root_url(server["url"]): server_load(server["url"]) for server in s["servers"]}
        progress = (s["done"], tuple(server["answered"] for server in s["servers"]),
                    tuple(load.generated if isinstance(load, ServerLoad) else None for load in loads.values()))
        return Look(progress, describe(s, loads))

    return Watch("the trainer", "the orchestrator", what, look, limits)
