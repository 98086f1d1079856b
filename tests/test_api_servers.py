"""The engine's start is not held behind the API servers' (vf_rl.inference.api_servers).

vLLM 0.26, whose ``APIServerProcessManager`` has the gathering step, runs only on the GPU
machines; the vLLM here (0.32, CPU) has none. The class below has 0.26's signature and a gathering
step that records that it was waited on, so the wrapping is checked here; the GPU run is
the launch-to-step-1 row of ``benchmarks/RESULTS.md``'s *Learning per wall-clock (reverse-text, one GPU)*.
"""

from __future__ import annotations

import subprocess
import sys

from vf_rl.inference.api_servers import overlap_engine_start


def _manager_class():
    class APIServerProcessManager:  # vllm/v1/utils.py 0.26's signature
        def __init__(self, listen_address, sock, args, num_servers, input_addresses, output_addresses,
                     target_server_fn=None, stats_update_address=None, tensor_queue=None):
            self.started = num_servers
            self.waited = False

        def gather_actual_addresses(self, timeout=600.0):
            self.waited = True
            return [f"tcp://127.0.0.1:{4000 + i}" for i in range(self.started)], ["tcp://127.0.0.1:5000"] * self.started

    return APIServerProcessManager


def test_ipc_addresses_come_back_without_waiting_for_the_api_servers():
    cls = _manager_class()
    assert overlap_engine_start(cls)
    inputs, outputs = ["ipc:///tmp/a", "ipc:///tmp/b"], ["ipc:///tmp/c", "ipc:///tmp/d"]
    manager = cls("127.0.0.1:8000", None, None, 2, input_addresses=inputs, output_addresses=outputs)
    assert manager.started == 2  # vLLM's own __init__ still ran
    assert manager.gather_actual_addresses() == (inputs, outputs)
    assert not manager.waited
    positional = cls("127.0.0.1:8000", None, None, 1, ["ipc:///tmp/e"], ["ipc:///tmp/f"])
    assert positional.gather_actual_addresses() == (["ipc:///tmp/e"], ["ipc:///tmp/f"]) and not positional.waited


def test_tcp_placeholders_are_gathered_as_vllm_does():
    cls = _manager_class()
    assert overlap_engine_start(cls)
    manager = cls("0.0.0.0:8000", None, None, 2, ["ipc:///tmp/a", "tcp://10.0.0.2:0"], ["ipc:///tmp/c"] * 2)
    inputs, _ = manager.gather_actual_addresses(timeout=5)
    assert manager.waited and inputs == ["tcp://127.0.0.1:4000", "tcp://127.0.0.1:4001"]


def test_other_shapes_are_left_alone():
    cls = _manager_class()
    assert overlap_engine_start(cls) and not overlap_engine_start(cls)  # once
    manager = cls("a", None, None, 1, ["ipc:///x"], ["ipc:///y"])
    assert manager.gather_actual_addresses() == (["ipc:///x"], ["ipc:///y"]) and not manager.waited

    class NoStep:  # vLLM 0.32: no gathering step
        def __init__(self, listen_address, input_addresses, output_addresses):
            pass

    assert not overlap_engine_start(NoStep) and not hasattr(NoStep, "gather_actual_addresses")

    class OtherInit:
        def __init__(self, listen_address, addresses):
            pass

        def gather_actual_addresses(self):
            return "vllm's"

    original = OtherInit.gather_actual_addresses
    assert not overlap_engine_start(OtherInit) and OtherInit.gather_actual_addresses is original


def test_the_installed_vllm_is_changed_only_where_it_gathers():
    """In a fresh process (vLLM's logging settings stay out of pytest's): the installed vLLM's class
    is wrapped exactly when it has the gathering step."""
    code = ("from vllm.v1.utils import APIServerProcessManager as m\n"
            "from vf_rl.inference.api_servers import overlap_engine_start\n"
            "has = hasattr(m, 'gather_actual_addresses')\n"
            "print('result', overlap_engine_start() == has, has)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1].startswith("result True")
