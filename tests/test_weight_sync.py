"""Weight-sync pieces that need no server: buckets, transport choice, training options.
(The transports themselves run against a real vf-vllm in test_server.py / test_lora_sync.py,
and on GPUs in test_gpu.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch

from vf_rl.config.rules import choose_weight_sync
from vf_rl.inference.buckets import Bucket, pack_buckets, plan_buckets, unpack_bucket


def named(*specs):
    torch.manual_seed(0)
    return {name: torch.randn(*shape).to(dtype) for name, shape, dtype in specs}


def test_buckets_respect_the_size_limit_keep_order_and_split_by_dtype():
    tensors = named(("a", (256,), torch.float32), ("b", (256,), torch.bfloat16), ("c", (512,), torch.float32),
                    ("d", (300,), torch.float32), ("big", (4096,), torch.float32), ("e", (8,), torch.bfloat16))
    buckets = plan_buckets(tensors.items(), bucket_bytes=4096)  # 1024 fp32 elements
    names = [[n for n, _, _ in b.tensors] for b in buckets]
    assert sorted(sum(names, [])) == sorted(tensors)
    for bucket in buckets:
        assert len({str(tensors[n].dtype) for n, _, _ in bucket.tensors}) == 1
        size = bucket.numel * tensors[bucket.tensors[0][0]].element_size()
        assert size <= 4096 or len(bucket.tensors) == 1  # only a tensor larger than the limit exceeds it
    assert ["big"] in names  # 16 KiB: a bucket of its own
    assert ["a", "c"] in names and ["d"] in names  # 1 KiB + 2 KiB fit; + 1.2 KiB would not
    assert ["b", "e"] in names


def test_pack_then_unpack_gives_the_same_tensors_through_json():
    tensors = named(("w", (3, 5), torch.bfloat16), ("v", (7,), torch.bfloat16), ("s", (2, 2, 2), torch.bfloat16),
                    ("f", (4,), torch.float32))
    buckets = plan_buckets(tensors.items(), bucket_bytes=40)  # w alone, v + s, f: three buffers
    assert len(buckets) == 3
    buffers = [torch.full((b.numel,), float("nan"), dtype=getattr(torch, b.dtype)) for b in buckets]
    pack_buckets(buckets, iter(reversed(tensors.items())), buffers)  # a stream, in any order
    for bucket, buffer in zip(buckets, buffers):
        wire = Bucket.from_json(bucket.to_json())  # what the worker rebuilds from the HTTP body
        assert buffer.shape == (wire.numel,) and not buffer.isnan().any()
        received = torch.empty_like(buffer).copy_(buffer)
        for name, view in unpack_bucket(wire, received):
            assert torch.equal(view, tensors[name]) and view.shape == tensors[name].shape


def test_packing_refuses_a_stream_that_does_not_match_the_plan():
    tensors = named(("w", (3, 5), torch.float32), ("v", (7,), torch.float32))
    buckets = plan_buckets(tensors.items(), 1 << 20)
    buffers = [torch.empty(b.numel) for b in buckets]
    with pytest.raises(ValueError, match="did not arrive"):
        pack_buckets(buckets, [("w", tensors["w"])], buffers)
    with pytest.raises(ValueError, match="x: not in the bucket plan"):
        pack_buckets(buckets, [*tensors.items(), ("x", torch.zeros(1))], buffers)
    with pytest.raises(ValueError, match="v: 8 elements"):
        pack_buckets(buckets, [("w", tensors["w"]), ("v", torch.zeros(8))], buffers)


@pytest.mark.parametrize("data, message", [
    ({"dtype": "int64", "numel": 1, "tensors": [["x", [1], 0]]}, "dtype"),
    ({"dtype": "float32", "numel": 5, "tensors": [["x", [2], 0], ["y", [2], 3]]}, "offset 3"),
    ({"dtype": "float32", "numel": 9, "tensors": [["x", [2, 2], 0]]}, "numel 9"),
])
def test_bad_bucket_metadata_is_rejected(data, message):
    with pytest.raises(ValueError, match=message):
        Bucket.from_json(data)


def test_bucket_planning_rejects_bad_input():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([], 0)
    with pytest.raises(ValueError, match="cannot be sent"):
        plan_buckets([("step", torch.zeros(2, dtype=torch.int64))], 1024)


@pytest.mark.parametrize("requested, trainer, server, expected", [
    ("auto", "cpu", ["cpu"], "filesystem"),
    ("auto", "GPU-1", ["GPU-0"], "nccl"),
    ("auto", "GPU-2", ["GPU-0", "GPU-1"], "nccl"),
    ("auto", "GPU-0", ["GPU-0"], "ipc"),
    ("auto", "GPU-0", ["GPU-0", "GPU-0"], "ipc"),
    ("auto", "GPU-1", ["GPU-0", "GPU-1"], "filesystem"),
    ("ipc", "GPU-0", ["GPU-0"], "ipc"),
    ("ipc", "GPU-1", ["GPU-0"], "needs every vLLM worker on the trainer's GPU"),
    ("ipc", "GPU-1", ["GPU-0", "GPU-1"], "needs every vLLM worker on the trainer's GPU"),
    ("ipc", "cpu", ["cpu"], "needs the trainer and the vLLM server on GPUs"),
    ("nccl", "GPU-1", ["GPU-0", "GPU-2"], "nccl"),
    ("lora", "GPU-0", ["GPU-0"], "lora"),
    ("filesystem", "cpu", ["cpu"], "filesystem"),
    ("nccl", "cpu", ["cpu"], "needs the trainer and the vLLM server on GPUs"),
    ("nccl", "GPU-0", ["GPU-1", "GPU-0"], "cannot connect two ranks on one GPU"),
    ("rdma", "GPU-1", ["GPU-0"], "expected one of"),
])
def test_transport_choice(requested, trainer, server, expected):
    """``auto`` picks nccl exactly when no GPU is shared, ipc when every worker is on the
    trainer's GPU; explicit choices that cannot work fail."""
    if expected in ("filesystem", "nccl", "ipc", "lora"):
        assert choose_weight_sync(requested, trainer, server) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            choose_weight_sync(requested, trainer, server)


def test_auto_does_not_pick_nccl_or_ipc_for_a_server_on_another_host():
    assert choose_weight_sync("auto", "GPU-1", ["GPU-0"], server_is_local=False) == "filesystem"
    assert choose_weight_sync("auto", "GPU-0", ["GPU-0"], server_is_local=False) == "filesystem"
    with pytest.raises(ValueError, match="on this machine"):
        choose_weight_sync("ipc", "GPU-0", ["GPU-0"], server_is_local=False)


def test_gpu_training_options_fall_back_on_the_cpu(monkeypatch):
    from vf_rl.config.rl_config import RLConfig
    from vf_rl.trainer import model as trainer_module

    args = RLConfig(output_dir="/tmp/unused", use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2)
    assert trainer_module.attention_implementation(args) == "sdpa"
    args.attn_implementation = "eager"
    assert trainer_module.attention_implementation(args) == "eager"
    assert trainer_module.apply_liger(torch.nn.Linear(2, 2), args) is False  # CPU: never patched, no warning
    # GPU-only path, simulated: liger requested but not installed -> a warning, training goes on without it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args.use_cpu = False
    monkeypatch.setattr(trainer_module.importlib.util, "find_spec", lambda name: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert trainer_module.apply_liger(torch.nn.Linear(2, 2), args) is False
    assert any("liger-kernel is not installed" in str(w.message) for w in caught)


def test_weight_sync_key_is_checked_by_rl_config():
    from vf_rl.config.rl_config import RLConfig

    with pytest.raises(ValueError, match="weight_sync: expected one of auto, filesystem, nccl, ipc, lora"):
        RLConfig(output_dir="/tmp/unused", use_cpu=True, weight_sync="disk", batch_size=4, rollouts_per_example=2,
                 micro_batch_size=2)


class _Recorder:
    """Stands in for the GPU-only pieces of a vLLM worker and its engine client (a CUDA model
    runner, several data-parallel engines), recording the order of what the extension does."""

    def __init__(self):
        self.events = []

    def broadcast(self, buffer, failed=None, what=None):
        buffer.copy_(torch.arange(buffer.numel(), dtype=buffer.dtype))
        self.events.append(("broadcast", buffer.numel()))

    def load_weights(self, weights):
        self.events.append(("load", [name for name, _ in weights]))


def test_a_gpu_worker_loads_each_broadcast_bucket_before_the_next_arrives(monkeypatch):
    """On a GPU no second copy of the model is held: bucket k is loaded before bucket k+1 is received.
    (An 8B model's 16 GB update does not fit in the 10% vLLM leaves free.)"""
    from types import SimpleNamespace

    from vf_rl.inference.worker_extension import WeightSyncExtension

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: SimpleNamespace(synchronize=lambda: None))
    tensors = named(("a", (600,), torch.float32), ("b", (600,), torch.float32), ("c", (100,), torch.float32))
    buckets = [b.to_json() for b in plan_buckets(tensors.items(), bucket_bytes=4096)]
    assert len(buckets) == 2
    recorder = _Recorder()
    worker = WeightSyncExtension()
    worker.device = SimpleNamespace(type="cuda")
    worker.vllm_config = SimpleNamespace(model_config=SimpleNamespace(quantization=None))
    worker.model_runner = SimpleNamespace(get_model=lambda: recorder)
    worker._vf_group = SimpleNamespace(broadcast=recorder.broadcast, device="cpu")
    result = worker.vf_receive_broadcast(buckets)
    assert result["tensors"] == 3
    assert recorder.events == [("broadcast", 600), ("load", ["a"]), ("broadcast", 700), ("load", ["b", "c"])]


def test_every_worker_gathers_the_workers_of_every_data_parallel_engine():
    """vLLM's collective_rpc returns only the first data-parallel engine's results; the routes
    need every worker's (the weight-broadcast group is sized from them)."""
    import asyncio
    from types import SimpleNamespace

    from vf_rl.inference.routes import every_worker

    class Core:  # vLLM 0.26's DP client: no call_utility_all_async
        core_engines = [b"\x00\x00", b"\x01\x00"]

        async def _call_utility_async(self, method, name, timeout, args, kwargs, engine):
            assert method == "collective_rpc" and kwargs is None
            return [f"{name}{args}@engine{engine[0]}/worker{w}" for w in range(2)]

    async def first_engine_only(method, args=()):
        return await Core()._call_utility_async("collective_rpc", method, None, args, None, engine=b"\x00")

    engine = SimpleNamespace(engine_core=Core(), collective_rpc=first_engine_only)
    expected = [f"vf_device_uuid(1,)@engine{e}/worker{w}" for e in range(2) for w in range(2)]
    assert asyncio.run(every_worker(engine, "vf_device_uuid", (1,))) == expected
    newer = Core()  # vLLM >= 0.32: one result per engine from call_utility_all_async
    newer.call_utility_all_async = lambda *call: asyncio.gather(*(Core()._call_utility_async(*call, engine=e)
                                                                  for e in Core.core_engines))
    assert asyncio.run(every_worker(SimpleNamespace(engine_core=newer), "vf_device_uuid", (1,))) == expected
    single = SimpleNamespace(engine_core=SimpleNamespace(core_engines=[b"\x00\x00"]), collective_rpc=first_engine_only)
    assert asyncio.run(every_worker(single, "vf_device_uuid", (1,))) == expected[:2]


@pytest.mark.parametrize("index, expected", [(0, [1, 2]), (1, [3, 4])])
def test_a_data_parallel_engine_takes_ranks_after_the_engines_before_it(monkeypatch, index, expected):
    """A dense model's data-parallel engines all run with ``data_parallel_rank = 0``; the rank in the
    broadcast group comes from ``data_parallel_index`` (else both engines would claim ranks 1-2)."""
    from types import SimpleNamespace

    import vllm.distributed.parallel_state as parallel_state

    from vf_rl.inference.worker_extension import WeightSyncExtension

    worker = WeightSyncExtension()
    worker.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_rank=0, data_parallel_index=index))
    ranks = []
    for tp_rank in range(2):
        monkeypatch.setattr(parallel_state, "get_tp_group", lambda r=tp_rank: SimpleNamespace(world_size=2, rank_in_group=r))
        monkeypatch.setattr(parallel_state, "get_pp_group", lambda: SimpleNamespace(world_size=1, rank_in_group=0))
        ranks.append(worker.vf_broadcast_rank())
    assert ranks == expected


def test_a_broadcast_a_member_will_never_join_fails_at_once_with_that_members_error():
    """A vLLM worker that fails before receiving (its server answers with the error) must not leave the
    trainer waiting out the group's timeout inside the broadcast: the broadcast stops with that error."""
    import threading

    from vf_rl.inference.communicator import BroadcastGroup, free_port

    port, groups, asked = free_port(), {}, threading.Event()
    worker = threading.Thread(target=lambda: groups.setdefault(1, BroadcastGroup("127.0.0.1", port, 1, 2, "gloo", 60.0)))
    worker.start()
    trainer = BroadcastGroup("127.0.0.1", port, 0, 2, "gloo", 60.0)
    worker.join()

    def failed():  # what the trainer sees: the server's HTTP answer, an error
        asked.set()
        return RuntimeError("vf-vllm /update_weights_broadcast failed (500): OutOfMemoryError")

    # the worker receives only once the trainer has given up (so gloo's pending send can finish)
    drain = threading.Thread(target=lambda: asked.wait(60) and groups[1].broadcast(torch.empty(1 << 26)))
    drain.start()
    with pytest.raises(RuntimeError, match="abandoned, a member failed: vf-vllm .* OutOfMemoryError"):
        trainer.broadcast(torch.ones(1 << 26), failed=failed)  # 256 MiB: more than a socket buffer holds
    drain.join(60)
    assert trainer.group is None and asked.is_set()


def test_after_a_broken_broadcast_the_servers_answer_that_it_went_away_is_what_the_push_raises():
    """``_server_lost``: of the servers' answers to a broadcast update that broke off, the first
    that says the server went away (its engine died, a broken connection: ``SERVER_LOST``, which the
    trainer waits out) is the push's error; another error, or no answer within the wait, is not."""
    from concurrent.futures import Future

    import httpx

    from vf_rl.inference.client import EngineDied
    from vf_rl.trainer.weight_sync import _server_lost

    def answered(error=None, result=None) -> Future:
        future = Future()
        future.set_exception(error) if error is not None else future.set_result(result)
        return future

    died, reset = EngineDied("its vLLM engine died"), httpx.RemoteProtocolError("Server disconnected")
    assert _server_lost([answered(result={}), answered(died)], 1.0) is died
    assert _server_lost([answered(RuntimeError("OutOfMemoryError")), answered(reset)], 1.0) is reset
    assert _server_lost([answered(RuntimeError("OutOfMemoryError"))], 1.0) is None
    # a server that does not answer within the wait is the watchdog's to name
    assert _server_lost([answered(result={}), Future()], 0.05) is None
