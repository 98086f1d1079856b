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


def kill_tree(pid: int, include_root: bool = True) -> None:
    """``SIGKILL`` every process below ``pid`` and, with ``include_root``, ``pid`` itself (as an
    OOM kill of a server and its engine processes would). Processes already gone are skipped.

    Raises:
        psutil.NoSuchProcess: ``pid`` does not exist."""
    import psutil

    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), *([root] if include_root else [])]:
        try:
            process.kill()
        except psutil.Error:
            pass  # gone already


def kill_children() -> None:
    """Kill every process this one started, and theirs (``SIGKILL``)."""
    kill_tree(os.getpid(), include_root=False)


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
