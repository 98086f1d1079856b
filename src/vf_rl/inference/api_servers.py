"""vLLM's engine initializes while its API-server processes start.

With ``--api-server-count`` above 1 (vf-rl derives up to 4 on a GPU host), ``vllm serve`` starts the
engine-core process and the API-server processes together, and gives the engine, in its start-up
handshake, the sockets of every API server. vLLM 0.26 sends that handshake only after each API
server has reported the addresses it bound (``APIServerProcessManager.gather_actual_addresses``,
which resolves ``tcp://host:0`` placeholders to ports), so the engine's whole initialization
(weights, torch.compile, CUDA graphs) waits for the API servers' own start: a fresh Python and
vLLM's imports each, tens of seconds (``docs/benchmarks.md``). Where the
engines are on this host, the addresses are IPC paths named before any process starts and there is
nothing to resolve: :func:`overlap_engine_start` hands them over at once, and the engine connects
to sockets that its API servers bind while it initializes (ZeroMQ queues what it sends until they
do). vLLM versions without that step (0.32 serves the CPU here) are left as they are.

What changes for a failure: an API server that dies while starting is reported once the engine has
initialized (vLLM's process monitor), rather than before.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def overlap_engine_start(manager: Any = None) -> bool:
    """Make ``manager`` (default vLLM's ``vllm.v1.utils.APIServerProcessManager``) return the
    addresses it was given from ``gather_actual_addresses`` when every one is an ``ipc://`` path,
    without waiting for the API-server processes; any other address (a ``tcp://`` one) is gathered
    as vLLM does.

    Returns:
        whether the class was changed: ``False`` when vLLM or the step is missing, the class's
        ``__init__`` does not take ``input_addresses``/``output_addresses``, or it is changed already.
    """
    if manager is None:
        try:
            from vllm.v1.utils import APIServerProcessManager as manager
        except ImportError:
            return False
    gather = getattr(manager, "gather_actual_addresses", None)
    if gather is None or getattr(gather, "vf_rl_overlap", False):
        return False
    init = manager.__init__
    signature = inspect.signature(init)
    if not {"input_addresses", "output_addresses"} <= set(signature.parameters):
        return False

    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        given = signature.bind(self, *args, **kwargs).arguments
        self.vf_rl_addresses = (list(given["input_addresses"]), list(given["output_addresses"]))
        init(self, *args, **kwargs)

    @functools.wraps(gather)
    def at_once(self, *args, **kwargs):
        inputs, outputs = getattr(self, "vf_rl_addresses", ([], []))
        if inputs and all(str(a).startswith("ipc://") for a in inputs + outputs):
            return list(inputs), list(outputs)
        return gather(self, *args, **kwargs)

    at_once.vf_rl_overlap = True
    manager.__init__ = recording_init
    manager.gather_actual_addresses = at_once
    return True
