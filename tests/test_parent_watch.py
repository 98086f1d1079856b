"""Helper processes end with the process that started them (vf_rl/parent_watch.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def test_kill_children_closes_what_an_environment_started():
    """The orchestrator's process kills the processes its environment started before it exits:
    a child holding the inherited output pipe would keep ``vf-rl --wait`` waiting."""
    script = textwrap.dedent("""
        import subprocess, sys
        from vf_rl.parent_watch import kill_children
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("started", flush=True)
        kill_children()
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the child outlived kill_children and kept the output pipe open")
    assert done.stdout.strip() == "started", done.stderr[-2000:]
