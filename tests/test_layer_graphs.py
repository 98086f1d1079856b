"""vf_rl.trainer.speed.layer_graphs (CUDA graphs recorded by hand over the decoder layers) and
scripts/gpu/layer_graphs_check.py, on the CPU: ``torch.cuda.make_graphed_callables`` cannot record
here, so a stand-in takes its place that does what torch's does to a module (replaces its
``forward`` with a replay, which accepts inputs of the recorded shapes only) and replays by
running the wrapped layers on the replay's inputs, or, ``stale``, on the recording's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
import layer_graphs_check as check  # noqa: E402

from vf_rl.trainer.speed import layer_graphs  # noqa: E402


@pytest.fixture
def stand_in(monkeypatch):
    """Records the sample shapes of each recording and each replay; ``state["stale"] = True`` makes
    replays run on the recording's inputs (a graph whose inputs were never copied in)."""
    state = {"recordings": [], "replays": [], "stale": False, "emptied": []}

    def graphed(callables, sample, pool=None):
        single = not isinstance(callables, tuple)
        callables, sample = ((callables,), (sample,)) if single else (callables, sample)
        shapes = tuple(tuple(t.shape) for t in sample[0])
        state["recordings"].append(shapes)

        def replay(forward, recorded):
            def run(*tensors):
                assert tuple(tuple(t.shape) for t in tensors) == shapes, "a replay of another shape"
                state["replays"].append(forward)
                return forward(*(recorded if state["stale"] else tensors))
            return run

        for c, args in zip(callables, sample):
            c.forward = replay(c.forward, args)
        return callables[0] if single else callables

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", graphed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: state["emptied"].append(len(state["recordings"])))
    monkeypatch.setattr(layer_graphs, "varlen_applies", lambda query, dropout=0.0: True)
    return state


@pytest.mark.parametrize("model_config", ["tiny", "qwen2-narrow"])  # Llama's and Qwen2's layer calls
def test_replayed_layers_train_as_the_layers_do(stand_in, model_config):
    """The check script's graph side on the CPU (two batches of different row lengths, every
    micro batch packed): its layers run through the tensor-only wrapper a recording replays, and
    the first steps' LoRA gradients equal the plain model's; replays on stale inputs fail it."""
    argv = ["--device", "cpu", "--model-config", model_config, "--no-compile", "--batch", "8", "--micro-batch", "2",
            "--prompt-len", "8", "--completion-len", "8", "--second-completion-len", "5", "--steps", "1",
            "--warmup", "0", "--sides", "layers,graphs"]
    assert check.main(argv) == 0
    assert len(stand_in["recordings"]) == 2 and len(stand_in["replays"]) > 0  # each row length once
    stand_in["stale"] = True
    assert check.main(argv) == 1


def test_a_shape_records_at_its_second_pass(stand_in):
    """A row shape (length, segments, gathered keys) runs its first pass as it is, is recorded at
    the start of its second pass (once, every layer in one graph, its layout's tensors among the
    inputs), and replays after, one replay per pass; a recording leaves other shapes' layers as they
    were; no-grad passes never record or replay."""
    args = check.parse_args(["--device", "cpu", "--model-config", "tiny", "--no-compile", "--mode", "realistic",
                             "--batch", "16", "--prompt-max", "96", "--max-tokens", "64"])
    model, graphs = check.build(args, torch.device("cpu"), graphs=True)
    cycle = check.batches(args, torch.device("cpu"))
    keys = [(mb.layout.cu_q.shape[0], mb.layout.cu_k.shape[0], mb.layout.key_index.shape[0], mb.input_ids.shape[1])
            for plan in cycle for mb in plan]
    recordings, replays = stand_in["recordings"], stand_in["replays"]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    for plan in cycle:  # first passes: recorded only where a shape came twice
        check.step(model, plan, optimizer)
    twice = {k for k in keys if keys.count(k) > 1}
    later = sum(k in keys[:i] for i, k in enumerate(keys))  # passes after a shape's first
    assert len(graphs.graphs) == len(recordings) == len(twice) and len(replays) == later
    for plan in cycle:  # every shape's second pass at the latest: recorded, and replayed from then on
        check.step(model, plan, optimizer)
    assert len(graphs.graphs) == len(recordings) == len(set(keys))
    # the recording's warm-up passes' cached blocks go back to the device after each recording
    assert stand_in["emptied"] == list(range(1, len(set(keys)) + 1))
    replays.clear()
    for plan in cycle:
        check.step(model, plan, optimizer)
    assert len(replays) == len(keys) and len(recordings) == len(set(keys))
    for shapes, key in zip(recordings, sorted(set(keys), key=keys.index)):
        assert shapes[0][1] == key[3] and shapes[-3:] == ((key[0],), (key[1],), (key[2],))  # hidden ... layout
    replays.clear()
    with torch.no_grad():
        check.packed_policy_logprobs(model, cycle[0][0])
    assert not replays and len(recordings) == len(set(keys))


def test_the_trainer_replays_recorded_layers_as_it_trains_eagerly(stand_in, monkeypatch, model_dir, tmp_path, request):
    """``record_layer_graphs`` on an ``RLTrainer``'s model (SmolLM2, LoRA, micro batches padded to
    bucket sizes): over two steps' forward/backward passes of one batch every shape is recorded
    once, at its second pass, later passes replay with every trainable parameter holding a
    ``.grad`` (views into one zeroed buffer) and the run's ``max_seq_len`` as the layout's bound, and each step's loss and adapter
    gradients equal the eager trainer's; autocast's weight cache is off from then on (a recording
    turning it off would otherwise recompile the layers)."""
    from test_compile import _trainer, group_samples
    from transformers import AutoTokenizer

    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.model import record_layer_graphs
    from vf_rl.trainer.speed.logprobs import selective_logprobs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    batch = Batch(step=0, samples=group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=5), rollouts=[],
                  metrics={})
    runs, bounds = {}, []
    for name in ("eager", "graphs"):
        trainer = _trainer(model_dir, tmp_path, name, tokenizer, env, micro_batch_tokens=40, torch_compile=False)
        trainable = [p for p in trainer.model.parameters() if p.requires_grad]
        ready = []
        if name == "eager":  # sampling log-probs near the model's own, so the ratios stay unmasked
            with torch.no_grad():
                for s in batch.samples:
                    ids = torch.tensor([s.input_ids])
                    own, _ = selective_logprobs(trainer.model(input_ids=ids).logits[:, :-1], ids[:, 1:])
                    s.sampling_logprobs = [0.0] + (own[0] + 0.05 * torch.randn(len(own[0]))).tolist()
        if name == "graphs":
            request.addfinalizer(lambda: torch.set_autocast_cache_enabled(True))
            assert record_layer_graphs(trainer.model) == trainer.model.config.num_hidden_layers
            assert not torch.is_autocast_cache_enabled()  # the state every compile and recording then sees
            trainer.cuda_graphs = True
            original = layer_graphs._FlatStack.forward
            monkeypatch.setattr(layer_graphs._FlatStack, "forward", lambda self, *t: ready.append(
                all(p.grad is not None for p in trainable)) or bounds.append(self.form[-1]) or original(self, *t))
        runs[name] = []
        for _ in range(2):
            trainer.model.zero_grad(set_to_none=True)
            loss, _ = trainer._train_on_batch(trainer.model, batch)
            runs[name].append((float(loss), torch.cat([p.grad.flatten().clone() for p in trainable])))
            if name == "graphs":  # the zero gradients made before the forward: views into one buffer
                assert len({p.grad.untyped_storage().data_ptr() for p in trainable}) == 1
    assert len(stand_in["recordings"]) >= 1 and len(stand_in["replays"]) > 0 and ready and all(ready)
    assert set(bounds) == {trainer.args.max_seq_len}  # the run's bound on the varlen kernel's segments
    for (loss_ref, grads_ref), (loss, grads) in zip(runs["eager"], runs["graphs"]):
        assert loss == pytest.approx(loss_ref, rel=1e-5) and loss != 0.0
        assert float((grads - grads_ref).norm() / grads_ref.norm()) < 1e-4


class _Toy(torch.nn.Module):
    """A decoder layer's calling convention: hidden states first, keyword arguments, the packed
    layout; ``extra`` returns a second output as well."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, hidden, shift, scale=1.0, extra=False, vf_rl_packing=None):
        out = torch.tanh(self.lin(hidden) + shift) * scale
        return (out, out.sum()) if extra else out


SHIFTS = [torch.randn(1, 5, 4), torch.randn(1, 5, 4)]


def _toy_pass(layers, hidden, layout, between=None, kwargs=None, upto=None):
    """The decoder's loop over ``layers[:upto]``, each given ``SHIFTS[0]`` (a tensor argument):
    ``between(i, h)`` changes layer ``i``'s input, ``kwargs(i)`` its keyword arguments."""
    for i, layer in enumerate(layers[:upto]):
        out = layer(between(i, hidden) if between else hidden, vf_rl_packing=layout,
                    **{"shift": SHIFTS[0], **(kwargs(i) if kwargs else {})})
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


@pytest.mark.parametrize("variant", ["plain", "other arguments", "other tensors", "changed between", "extra output",
                                     "fewer layers", "no room"])
def test_only_a_plain_loop_over_the_layers_is_recorded(stand_in, variant):
    """One graph stands for the layers' loop only when the first pass of a shape called every
    layer in order, each on the previous one's output and with layer 0's other arguments (the same
    tensors, not tensors of the same shape: rotary tables per layer type), each
    returning its hidden states alone; other loops run the layers as they are, with the same
    results; a loop that changes after its recording fails loudly instead of replaying; past
    ``max_shapes`` nothing more records."""
    from vf_rl.trainer.speed.packing import PackedLayout

    torch.manual_seed(0)
    layers = [_Toy().train() for _ in range(3)]
    reference = [_Toy().train() for _ in range(3)]
    for ref, layer in zip(reference, layers):
        ref.load_state_dict(layer.state_dict())
    graphs = layer_graphs.LayerGraphs(layers, max_shapes=0 if variant == "no room" else 64)
    layout = PackedLayout(torch.tensor([0, 5]), torch.tensor([0, 5]), None, 5, 5, [(0, 5, 0, 5)])
    how = {"other arguments": dict(kwargs=lambda i: {"scale": 2.0} if i == 1 else {}),
           "other tensors": dict(kwargs=lambda i: {"shift": SHIFTS[1]} if i == 1 else {}),
           "changed between": dict(between=lambda i, h: h * 2 if i == 1 else h),
           "extra output": dict(kwargs=lambda i: {"extra": True}),
           "fewer layers": dict(upto=2)}.get(variant, {})
    x = torch.randn(1, 5, 4)
    for _ in range(3):
        hidden = x.clone().requires_grad_(True)
        out = _toy_pass(layers, hidden, layout, **how)
        out.sum().backward()
        expected_in = x.clone().requires_grad_(True)
        expected = _toy_pass(reference, expected_in, layout, **how)
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(hidden.grad, expected_in.grad)
        for ref, layer in zip(reference, layers):
            torch.testing.assert_close(layer.lin.weight.grad, ref.lin.weight.grad)
    if variant != "plain":
        assert not graphs.graphs and not stand_in["recordings"] and not stand_in["replays"]
        return
    assert len(stand_in["recordings"]) == 1 and len(stand_in["replays"]) == 2  # passes 2 and 3, one graph each
    with pytest.raises(RuntimeError, match="decoder layer 1 was called on other hidden states"):
        _toy_pass(layers, x.clone().requires_grad_(True), layout, between=lambda i, h: h * 2 if i == 1 else h)


def test_a_recording_keeps_the_layouts_bound(stand_in):
    """The layers a recording replays get the layout's run-wide ``bound`` (what the compiled layer
    passes the varlen kernel for its longest segments), and a layout of the same shapes with
    another bound records a graph of its own, never replaying one recorded for a smaller bound."""
    from vf_rl.trainer.speed.packing import PackedLayout

    seen = []

    class Seeing(_Toy):
        def forward(self, hidden, shift, scale=1.0, extra=False, vf_rl_packing=None):
            seen.append(vf_rl_packing.bound)
            return super().forward(hidden, shift, scale, extra)

    layers = [Seeing().train() for _ in range(2)]
    graphs = layer_graphs.LayerGraphs(layers)
    x = torch.randn(1, 5, 4)
    for bound in (8, 8, 8, 0, 0):
        layout = PackedLayout(torch.tensor([0, 5]), torch.tensor([0, 5]), None, 5, 5, [(0, 5, 0, 5)], bound)
        seen.clear()
        _toy_pass(layers, x.clone().requires_grad_(True), layout).sum().backward()
        assert seen == [bound, bound]
    assert len(graphs.graphs) == len(stand_in["recordings"]) == 2
    assert len(stand_in["replays"]) == 3  # bound 8's second and third passes, bound 0's second


def test_a_recording_that_fails_leaves_the_layers_compiled(stand_in, monkeypatch, capsys):
    """A capture that raises (a layer reading a value on the host, or no memory for the recording's
    warm-up passes) is reported in one line; the pass and every later one run the layers as they are,
    with the same results, and nothing is recorded again."""
    from vf_rl.trainer.speed.packing import PackedLayout

    tries = []

    def failing(callables, sample, pool=None):
        tries.append(len(sample))
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore lines")

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", failing)
    torch.manual_seed(0)
    layers = [_Toy().train() for _ in range(3)]
    reference = [_Toy().train() for _ in range(3)]
    for ref, layer in zip(reference, layers):
        ref.load_state_dict(layer.state_dict())
    graphs = layer_graphs.LayerGraphs(layers)
    x = torch.randn(1, 5, 4)
    for bound in (8, 8, 8, 0, 0):  # two shapes (the bound is in the key), each seen often enough to be recorded
        layout = PackedLayout(torch.tensor([0, 5]), torch.tensor([0, 5]), None, 5, 5, [(0, 5, 0, 5)], bound)
        hidden, expected_in = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out, expected = _toy_pass(layers, hidden, layout), _toy_pass(reference, expected_in, layout)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(hidden.grad, expected_in.grad)
        for ref, layer in zip(reference, layers):
            torch.testing.assert_close(layer.lin.weight.grad, ref.lin.weight.grad)
    assert len(tries) == 1 and not graphs.graphs and not stand_in["replays"]
    assert graphs.failed == "CUDA error: operation not permitted when stream is capturing"
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("layer graphs:")]
    assert lines == ["layer graphs: recording a row of 5 tokens failed (CUDA error: operation not permitted when "
                     "stream is capturing); the compiled layers run without CUDA graphs from now on"]
