"""Helper processes that end with the process that started them.

A child blocked on a queue never learns that its parent died (it holds its own copy of the
queue's pipe), and an orphan that inherited the parent's stdout keeps a tmux pane's ``tee``, and
so ``vf-rl --wait``, from finishing. Each helper process (the orchestrator, math-verify's worker)
therefore watches its parent's pid, and the orchestrator's process ends the processes its
environment started (verifiers' ``MathRubric`` keeps a process pool) before it exits."""

from __future__ import annotations

import os
import threading
import time


def kill_children() -> None:
    """Kill every process this one started, and theirs (``SIGKILL``)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass  # gone already


def exit_with(parent: int, period_s: float = 1.0) -> None:
    """Block until ``parent`` is no longer this process's parent (it exited or was killed),
    checking every ``period_s`` seconds, then kill this process's children and end it at once
    (``os._exit(0)``)."""
    while os.getppid() == parent:
        time.sleep(period_s)
    kill_children()
    os._exit(0)


def start_parent_watch() -> None:
    """Run :func:`exit_with` for the current parent in a daemon thread."""
    threading.Thread(target=exit_with, args=(os.getppid(),), name="vf-rl-parent-watch", daemon=True).start()
