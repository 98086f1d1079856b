"""torch_compile: each decoder layer compiled in place (inductor on the CPU here) trains like the
eager model, on real SmolLM2 with a LoRA adapter, padded and packed micro batches."""

import pytest
import torch
from test_packing import group_samples

from vf_rl.trainer.speed.logprobs import selective_logprobs


def _trainer(model_dir, tmp_path, name, tokenizer, env, **keys):
    from transformers import AutoModelForCausalLM

    from vf_rl import RLConfig, RLTrainer

    torch.manual_seed(0)  # the same LoRA A on every trainer (peft draws it when the adapter is added)
    args = RLConfig(output_dir=str(tmp_path / name), use_cpu=True, batch_size=8, rollouts_per_example=4,
                    micro_batch_size=4, max_seq_len=32, max_steps=1, report_to=[], use_lora=True, lora_rank=4,
                    lora_alpha=8, **keys)
    trainer = RLTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), env=env,
                        args=args, processing_class=tokenizer, served_model_name="t")
    with torch.no_grad():  # a non-zero LoRA B (same on both sides), so both adapter matrices get gradients
        for param_name, p in trainer.model.named_parameters():
            if "lora_B" in param_name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    return trainer


@pytest.mark.slow
def test_compiled_layers_train_like_the_eager_ones(model_dir, tmp_path):
    """``torch_compile = true``: every decoder layer is compiled in place (parameter names and
    the LoRA adapter unchanged); the loss, statistics and adapter gradients of a step equal the
    eager model's to float32 tolerance, for padded and for packed micro batches (shared prompts,
    whose attention runs outside the compiled graph); compiled code really ran (no silent fall
    back to eager); a second step with the same shapes compiles nothing new, and once the
    layers have seen two shapes, packed micro batches of new lengths and layouts compile nothing
    new either (dynamic shapes; the layout's host ints stay out of the graph)."""
    from torch._dynamo.utils import counters
    from transformers import AutoTokenizer

    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.model import decoder_layers

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    samples = group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=3)
    plain = _trainer(model_dir, tmp_path, "eager", tokenizer, env, torch_compile=False)
    with torch.no_grad():  # sampling log-probs near the model's own, so the ratios stay unmasked
        for s in samples:
            ids = torch.tensor([s.input_ids])
            own, _ = selective_logprobs(plain.model(input_ids=ids).logits[:, :-1], ids[:, 1:])
            s.sampling_logprobs = [0.0] + (own[0] + 0.05 * torch.randn(len(own[0]))).tolist()
    batch = Batch(step=0, samples=samples, rollouts=[], metrics={})

    def step(trainer):
        trainer.model.zero_grad()
        loss, stats = trainer._train_on_batch(trainer.model, batch)
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        return float(loss), stats, grads

    for keys in (dict(padding_free=False), dict(micro_batch_tokens=40)):  # padded rows; packed, shared prompts
        eager = _trainer(model_dir, tmp_path, "eager", tokenizer, env, torch_compile=False, **keys)
        compiled = _trainer(model_dir, tmp_path, "compiled", tokenizer, env, torch_compile=True, **keys)
        layers = decoder_layers(compiled.model)
        assert len(layers) == compiled.model.config.num_hidden_layers
        assert all(layer._compiled_call_impl is not None for layer in layers)
        assert all(layer._compiled_call_impl is None for layer in decoder_layers(eager.model))
        assert [n for n, _ in compiled.model.named_parameters()] == [n for n, _ in eager.model.named_parameters()]

        loss_ref, stats_ref, grads_ref = step(eager)
        counters.clear()
        loss, stats, grads = step(compiled)
        assert counters["aot_autograd"]["ok"] > 0 and counters["inductor"], dict(counters)  # compiled, not eager
        graphs = counters["stats"]["unique_graphs"]
        assert step(compiled)[0] == pytest.approx(loss, rel=1e-6)
        assert counters["stats"]["unique_graphs"] == graphs, "the same shapes compiled again"

        if "micro_batch_tokens" in keys:  # new lengths and layouts: dynamic shapes once, then nothing new
            for seed, spec in enumerate(([(7, [3, 9, 2, 5]), (11, [4, 4, 6, 1])], [(6, [8, 1, 3, 2]), (4, [9, 7, 2, 5])],
                                         [(12, [2, 2, 9, 3]), (3, [6, 5, 8, 4])])):
                other = group_samples(spec, seed=seed)
                for s in other:
                    s.sampling_logprobs = [0.0] * len(s.input_ids)
                if seed == 2:
                    graphs = counters["stats"]["unique_graphs"]
                compiled._train_on_batch(compiled.model, Batch(step=0, samples=other, rollouts=[], metrics={}))
            assert counters["stats"]["unique_graphs"] == graphs, "a new layout compiled the layers again"
        assert loss == pytest.approx(loss_ref, rel=1e-5) and loss != 0.0
        for key in ("importance_ratio", "mismatch_kl", "entropy", "tokens/trained", "tokens/loss"):
            assert stats[key] == pytest.approx(stats_ref[key], rel=1e-4, abs=1e-6), (keys, key)
        assert grads.keys() == grads_ref.keys() and any("lora_A" in n for n in grads)
        flat, flat_ref = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, grads_ref))
        assert float((flat - flat_ref).norm() / flat_ref.norm()) < 1e-4, keys


def test_torch_compile_default_is_on_with_a_gpu():
    """Unset, ``torch_compile`` is on with a GPU unless DeepSpeed is used (LoRA and full weights:
    host-bound steps, where the compiled layers measured faster) and off on the CPU; a compile
    backend or mode turns it on; explicit values are kept; ``true`` with DeepSpeed is refused."""
    from vf_rl.config.args import rl_fields
    from vf_rl.config.defaults import resolve_trainer_args
    from vf_rl.config.rules import ConfigError, check_trainer_args

    assert rl_fields()["torch_compile"].default is None

    def resolved(has_gpu, **keys):
        return resolve_trainer_args(keys, has_gpu)["torch_compile"]

    assert resolved(True) is True and resolved(True, use_lora=False) is True
    assert resolved(False) is False
    assert resolved(True, deepspeed="configs/deepspeed/zero3.json") is False
    assert resolved(False, torch_compile_mode="max-autotune") is True
    assert resolved(True, torch_compile=False) is False and resolved(False, torch_compile=True) is True
    with pytest.raises(ConfigError, match="torch_compile = true is not supported with deepspeed"):
        check_trainer_args(resolve_trainer_args({"torch_compile": True, "deepspeed": "configs/deepspeed/zero3.json"},
                                                True), 1, True)


def _cpu_varlen():
    """A CPU stand-in for ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention, CUDA only):
    a custom op with a fake kernel and its own backward, as the real one, computing the segment
    attention of ``attention.segment_attention``; it checks that the longest-segment arguments
    bound the real segments (the kernel's contract) and keeps the bounds it got in ``calls``."""
    from torch.library import custom_op

    from vf_rl.trainer.speed.attention import segment_attention
    from vf_rl.trainer.speed.packing import PackedLayout

    def segments(q, k, v, cu_q, cu_k):
        cq, ck = cu_q.tolist(), cu_k.tolist()
        layout = PackedLayout(cu_q, cu_k, None, 0, 0, list(zip(cq, cq[1:], ck, ck[1:])))
        return segment_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], layout, None)[0]

    @custom_op("vf_rl_test::varlen", mutates_args=())
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int) -> torch.Tensor:
        assert max_q >= int((cu_q[1:] - cu_q[:-1]).max()) and max_k >= int((cu_k[1:] - cu_k[:-1]).max())
        calls.append((max_q, max_k, q.shape[0], k.shape[0]))
        return segments(q, k, v, cu_q, cu_k).contiguous()

    @forward.register_fake
    def _(q, k, v, cu_q, cu_k, max_q, max_k):
        return torch.empty_like(q)

    @custom_op("vf_rl_test::varlen_backward", mutates_args=())
    def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                    cu_k: torch.Tensor) -> list[torch.Tensor]:
        _, vjp = torch.func.vjp(lambda a, b, c: segments(a, b, c, cu_q, cu_k), q, k, v)
        return [g.contiguous() for g in vjp(grad)]

    @backward_op.register_fake
    def _(grad, q, k, v, cu_q, cu_k):
        return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:5])

    forward.register_autograd(lambda ctx, grad: (*backward_op(grad, *ctx.saved_tensors), None, None, None, None),
                              setup_context=setup_context)

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, is_causal=True):
        groups = q.shape[1] // k.shape[1]
        return forward(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), cu_q, cu_k, max_q, max_k)

    calls = []
    return varlen_attn, calls


@pytest.mark.parametrize("max_seq_len", [0, 32, 64])  # no bound; one under every row's length; one over the rows'
def test_packed_attention_traces_into_the_compiled_layer(monkeypatch, max_seq_len):
    """On the GPU's varlen kernel (a CPU stand-in here: the real one is CUDA-only) packed
    attention traces into each compiled decoder layer: no graph break, gradients equal the eager
    model's for packed rows with shared prompts, and the first row compiles the layer with the
    row's sizes dynamic (``model._mark_row_sizes``): rows of new lengths and longest segments,
    and a row whose samples share no prompt (its keys gathered by an identity index), compile
    nothing new. The kernel's longest-segment arguments are the row's symbolic sizes, capped by the
    layout's run-wide bound (``max_seq_len``) where it has one, never its exact host ints."""
    import copy

    from test_packing import group_samples
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM

    from vf_rl.trainer.model import compile_layers
    from vf_rl.trainer.speed import attention
    from vf_rl.trainer.speed.logprobs import _no_mask
    from vf_rl.trainer.speed.packing import packed_micro_batch

    varlen, calls = _cpu_varlen()
    monkeypatch.setattr(attention, "_VARLEN", varlen)
    monkeypatch.setattr(attention, "_VARLEN_PARAMS", ("is_causal",))
    monkeypatch.setattr(attention, "varlen_applies", lambda query, dropout=0.0: True)
    torch.manual_seed(0)
    eager = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=100))
    eager.set_attn_implementation(attention.register_attention())
    compiled = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    counters.clear()
    assert compile_layers(compiled, counter) == 3
    specs = ([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], [(7, [3, 9, 2]), (11, [4, 4, 6, 1])],
             [(6, [8, 1, 3, 2]), (4, [9, 7, 2, 5])], [(12, [2, 2, 9, 3]), (3, [6, 5, 8, 4])],
             [(6, [8]), (9, [3]), (4, [5])])  # the last shares no prompt: its keys are gathered all the same
    for i, spec in enumerate(specs):
        mb = packed_micro_batch(group_samples(spec, seed=i), share_prompts=True, max_seq_len=max_seq_len)
        assert mb.layout.key_index is not None and mb.layout.bound == max_seq_len  # keys gathered inside the graph
        calls.clear()
        grads = []
        for model in (eager, compiled):
            model.zero_grad()
            logits = model(input_ids=mb.input_ids % 100, position_ids=mb.position_ids, use_cache=False,
                           attention_mask=_no_mask(mb.input_ids.device), vf_rl_packing=mb.layout).logits
            logits.float().pow(2).mean().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
        eager_calls, compiled_calls = calls[:3], calls[3:]  # each model's three layers' forwards
        assert [c[:2] for c in eager_calls] == [(mb.layout.max_q, mb.layout.max_k)] * 3
        assert [c[:2] for c in compiled_calls] == [(min(max_seq_len, c[2]), min(max_seq_len, c[3])) if max_seq_len
                                                   else c[2:] for c in compiled_calls]
        if i == 0:
            frames = counter.frame_count
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counter.frame_count == frames == 1, "rows of new sizes compiled the layer again"


def test_compiling_before_the_first_step_leaves_the_step_nothing_to_compile(model_dir, tmp_path):
    """``warmup.warm_up`` (what ``RLTrainer.train`` runs before the first step with
    ``torch_compile``) compiles every graph a real step then runs, per-layer and as CUDA graphs
    (aot_eager here): steps on batches of other lengths, groups and sample counts compile nothing; the warm-up
    leaves the weights, the gradients (none) and torch's RNG state as they were."""
    from test_packing import group_samples
    from torch._dynamo.utils import counters
    from transformers import AutoTokenizer

    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.speed.warmup import warm_up

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    for name, mode in (("layers", None), ("graphs", "reduce-overhead")):
        torch._dynamo.reset()
        counters.clear()
        trainer = _trainer(model_dir, tmp_path, name, tokenizer, env, torch_compile=True,
                           torch_compile_backend="aot_eager", torch_compile_mode=mode)
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        rng = torch.get_rng_state()
        assert warm_up(trainer) is not None and warm_up(trainer) is None  # once per trainer
        compiled = counters["stats"]["unique_graphs"]
        assert compiled > 0 and trainer.cuda_graphs == (mode is not None)
        assert torch.equal(torch.get_rng_state(), rng)
        assert all(p.grad is None for p in trainer.model.parameters())
        assert all(torch.equal(p, weights[n]) for n, p in trainer.model.named_parameters())
        for seed, spec in enumerate(([(7, [3, 9, 2, 5]), (11, [4, 4, 6, 1])], [(12, [2, 30, 9]), (3, [6, 5]), (8, [40])])):
            samples = group_samples(spec, seed=seed)
            trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[], metrics={}))
            assert counters["stats"]["unique_graphs"] == compiled, f"{name}: step {seed + 1} compiled again"


def test_the_stack_region_compiles_twice_then_never_again():
    """``compile_stack`` compiles the decoder stack for its first row length, then once more at the
    second with the length dynamic; rows of any later length run that graph (each new length
    compiled on its own would cost minutes on a GPU)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import LlamaConfig, LlamaForCausalLM

    from vf_rl.trainer.model import compile_stack

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    counter = CompileCounterWithBackend("aot_eager")
    assert compile_stack(model, counter)
    seen = []  # the stack's frames after each call (it graph-breaks on the CPU)
    for length in (9, 14, 23, 6, 31):
        model(input_ids=torch.randint(0, 100, (1, length)), use_cache=False).logits.float().mean().backward()
        seen.append(counter.frame_count)
    assert 0 < seen[0] < seen[1], "the second length ran the first length's static graph"
    assert seen[1:] == [seen[1]] * 4, f"later lengths compiled the stack again: {seen}"


@pytest.mark.parametrize("max_seq_len", [0, 32])
def test_the_stack_region_compiles_once_for_packed_rows(monkeypatch, max_seq_len):
    """Packed rows (how the trainer runs a compiled model's micro batches), the stack compiled as one
    region with the GPU's varlen attention (a CPU stand-in): the first row compiles the stack with
    its length, segment count and gathered keys dynamic, and rows of other sizes, with and without
    shared prompts, run that graph (a second compile of the stack costs minutes on a GPU), with or
    without the layouts' run-wide bound."""
    from test_packing import group_samples
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM

    from vf_rl.trainer.model import compile_stack
    from vf_rl.trainer.speed import attention
    from vf_rl.trainer.speed.logprobs import _no_mask
    from vf_rl.trainer.speed.packing import packed_micro_batch

    monkeypatch.setattr(attention, "_VARLEN", _cpu_varlen()[0])
    monkeypatch.setattr(attention, "_VARLEN_PARAMS", ("is_causal",))
    monkeypatch.setattr(attention, "varlen_applies", lambda query, dropout=0.0: True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    model.set_attn_implementation(attention.register_attention())
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()  # no frame state (sizes seen) left by other tests' compiles of the same code
    counters.clear()
    assert compile_stack(model, counter)
    seen = []
    for i, spec in enumerate(([(9, [6, 2, 7, 4])], [(5, [3, 9]), (11, [4, 4, 6])], [(6, [8]), (9, [3]), (4, [5])],
                              [(12, [2, 2, 9, 3, 1]), (3, [6, 5])])):
        mb = packed_micro_batch(group_samples(spec, seed=i), share_prompts=True, max_seq_len=max_seq_len)
        model(input_ids=mb.input_ids % 100, position_ids=mb.position_ids, use_cache=False,
              attention_mask=_no_mask(mb.input_ids.device), vf_rl_packing=mb.layout).logits.float().mean().backward()
        seen.append(counter.frame_count)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert seen == [1] * 4, f"rows of new sizes compiled the stack again: {seen}"


def test_lora_layers_share_one_compiled_graph():
    """With LoRA the input embeddings are frozen, so the first layer's input would not require
    grad and the layers' shared code would compile a second graph for it: ``compile_layers`` makes
    the embeddings' output require grad, so one graph serves every layer, while the embedding
    weights stay frozen and the adapter's gradients equal the eager model's."""
    import copy

    from peft import LoraConfig, get_peft_model
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import LlamaConfig, LlamaForCausalLM

    from vf_rl.trainer.model import compile_layers

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    eager = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    compiled = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    assert compile_layers(compiled, counter) == 3
    ids = torch.randint(0, 100, (2, 9))
    grads = []
    for model in (eager, compiled):
        model(input_ids=ids, use_cache=False).logits.float().pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert counter.frame_count == 1, "the first layer compiled a graph of its own"
    assert not compiled.get_input_embeddings().weight.requires_grad
    assert grads[1].keys() == grads[0].keys() and any("lora_A" in n for n in grads[0])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # the default tier: test_cuda_graph_modes_compile_and_pad_micro_batches (padded micro batches, grads = eager)
def test_the_stack_region_accumulates_gradients_as_eager_code():
    """scripts/gpu/cudagraph_accum_check.py runs the trainer's ``compile_stack`` as CUDA graphs over
    micro batches with accumulated gradients against eager code, then packed micro batches of
    different layouts padded to one shape, then of three shapes (compiled static, then dynamic,
    then nothing more), against the stack compiled without CUDA graphs; on the
    CPU inductor skips the CUDA graphs, so this checks the stack region, the padding, the script
    itself (the GPU run checks the graphs) and that every trainable parameter has a ``.grad``
    before each backward (without one, a replayed backward graph overwrites the gradient)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "cudagraph_accum_check.py"
    out = subprocess.run([sys.executable, str(script), "--micro-batches", "2"], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-1000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 9 and all("2 micro batches on cpu" in line for line in lines[:3])
    assert all("2 packed micro batches of one shape" in line for line in lines[3:6])
    assert all("packed micro batches of shapes (N, S + 1, K) [(128, 5, 144), (256, 9, 288), (512, 17, 576)]" in line
               for line in lines[6:])
    assert all(float(line.rsplit(" ", 1)[1]) <= 1e-4 for line in lines)


# max-autotune compiles the stack as one region: test_the_stack_region_compiles_once_for_packed_rows (default tier)
@pytest.mark.parametrize("mode", ["reduce-overhead", pytest.param("max-autotune", marks=pytest.mark.slow)])
def test_cuda_graph_modes_compile_and_pad_micro_batches(model_dir, tmp_path, mode):
    """``torch_compile_mode = "reduce-overhead"``: each decoder layer compiles and is called
    through ``LayerGraphs`` (which records on a GPU only), the stack not compiled as one;
    ``"max-autotune"``: the decoder stack compiles as one region (no layer on its own). Either way
    every micro batch runs packed and padded to bucket sizes (the few shapes whose CUDA graphs a
    GPU replays; aot_eager here), every trainable parameter has a ``.grad`` before each forward,
    and the step's loss, statistics and adapter gradients equal the eager trainer's."""
    from transformers import AutoTokenizer

    from vf_rl.config.shape_grid import bucket
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.model import base_model, decoder_layers

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    samples = group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=5)
    batch = Batch(step=0, samples=samples, rollouts=[], metrics={})
    results = []
    for name, keys in (("eager", dict(torch_compile=False)),
                       ("graphs", dict(torch_compile_backend="aot_eager", torch_compile_mode=mode))):
        trainer = _trainer(model_dir, tmp_path, name, tokenizer, env, micro_batch_tokens=40, **keys)
        if name == "eager":  # sampling log-probs near the model's own, so the ratios stay unmasked
            with torch.no_grad():
                for s in samples:
                    ids = torch.tensor([s.input_ids])
                    own, _ = selective_logprobs(trainer.model(input_ids=ids).logits[:, :-1], ids[:, 1:])
                    s.sampling_logprobs = [0.0] + (own[0] + 0.05 * torch.randn(len(own[0]))).tolist()
        stack = base_model(trainer.model).get_decoder()
        seen = []
        stack.register_forward_pre_hook(lambda _, args, kwargs: seen.append(
            (kwargs["input_ids"].shape[1], kwargs.get("vf_rl_packing") is not None,
             all(p.grad is not None for p in trainer.model.parameters() if p.requires_grad))), with_kwargs=True)
        trainer.model.zero_grad(set_to_none=True)
        loss, stats = trainer._train_on_batch(trainer.model, batch)
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        results.append((float(loss), stats, grads))
        if name == "graphs":
            routed = ["LayerGraphs" in getattr(layer._compiled_call_impl, "__qualname__", "")
                      for layer in decoder_layers(trainer.model)]
            assert trainer.cuda_graphs and routed
            if mode == "reduce-overhead":
                assert stack._compiled_call_impl is None and all(routed)
            else:
                assert stack._compiled_call_impl is not None and not any(routed)
                assert all(layer._compiled_call_impl is None for layer in decoder_layers(trainer.model))
            assert len(seen) >= 2 and all(packed and grads_ready and n == bucket(max(n, 64), 64)
                                          for n, packed, grads_ready in seen), seen
        else:
            assert not trainer.cuda_graphs and stack._compiled_call_impl is None
    (loss_ref, stats_ref, grads_ref), (loss, stats, grads) = results
    assert loss == pytest.approx(loss_ref, rel=1e-5) and loss != 0.0
    for key in ("importance_ratio", "mismatch_kl", "entropy", "tokens/trained", "tokens/loss"):
        assert stats[key] == pytest.approx(stats_ref[key], rel=1e-4, abs=1e-6), key
    flat, flat_ref = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, grads_ref))
    assert float((flat - flat_ref).norm() / flat_ref.norm()) < 1e-4


def test_a_shared_gpu_compiles_once_vllm_holds_its_share(monkeypatch, capsys):
    """``[inference] shared``: the warm-up's compile starts once the memory other processes hold on
    the trainer's GPU (total - free - this process's reserved) reaches 90% of vLLM's share, half of it
    grown since the first reading (memory an unrelated process held already is not vLLM's), not when
    its server answers; a server that answers first, an unknown share or a CPU trainer: False (the
    compile runs after the server is up); no sign and no answer in time: the server wait's TimeoutError.
    The GPU's memory readings are stand-ins (no GPU here)."""
    from types import SimpleNamespace

    from vf_rl.trainer.speed import warmup

    total, gib = 80 * 2**30, 2**30
    readings = []  # GiB other processes hold, one per poll

    def mem_get_info(device):
        used = readings.pop(0) if len(readings) > 1 else readings[0]
        return total - (used + 6) * gib, total  # this process's 6 GiB reserved on top

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 6 * gib)
    healthy = {"now": False}

    class Server:
        def is_healthy(self):
            return healthy["now"]

        def wait_until_ready(self, timeout):
            raise TimeoutError("vf-vllm at http://x not ready after 0 s")

    def trainer(share, device="cuda", timeout=60.0):
        return SimpleNamespace(server_shares_gpu=share, servers=[Server()], is_world_process_zero=lambda: True,
                               args=SimpleNamespace(device=torch.device(device), vllm_server_timeout=timeout))

    readings[:] = [1, 3, 20, 21.5, 22]  # weights, profiling, then the KV cache: 0.3 x 80 x 0.9 = 21.6 GiB
    assert warmup.server_memory_taken(trainer(0.3), poll_s=0.0) is True and readings == [22]
    assert "vf-vllm holds 22.0 GiB of this GPU" in capsys.readouterr().out
    # an unrelated process's 30 GiB from the start: not vLLM's (its weights and profiling on top stay waiting)
    readings[:] = [30, 31, 33, 52, 53]
    assert warmup.server_memory_taken(trainer(0.3), poll_s=0.0) is True and readings == [53]
    assert "vf-vllm holds 52.0 GiB" in capsys.readouterr().out
    readings[:] = [21.5]  # stays just under: the server answering first ends the wait
    healthy["now"] = True
    assert warmup.server_memory_taken(trainer(0.3), poll_s=0.0) is False
    assert warmup.server_memory_taken(trainer(True), poll_s=0.0) is False
    assert warmup.server_memory_taken(trainer(0.3, device="cpu"), poll_s=0.0) is False
    healthy["now"] = False
    with pytest.raises(TimeoutError, match="not ready after"):
        warmup.server_memory_taken(trainer(0.3, timeout=0.0), poll_s=0.0)


def test_projections_on_one_input_compile_as_one_product(model_dir, monkeypatch):
    """``trainer/speed/fusion.py`` in a compiled SmolLM2 decoder layer with a LoRA adapter: the frozen q, k
    and v projections become one product, and so do the adapter's ``A`` matrices on the attention's
    input and on the MLP's (the gate and up projections, wider than their input, stay apart); the
    layer's output and gradients equal the eager layer's, and its backward keeps no more tensors
    than the unfused compile's (the concatenated weights are recomputed there, not kept)."""
    import copy

    import torch._inductor.config as inductor_config
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vf_rl.trainer.model import _compile_region
    from vf_rl.trainer.speed import fusion

    monkeypatch.setattr(inductor_config, "force_disable_caches", True)  # a cache hit would skip the pass
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                         "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    decoder = model.base_model.model.model
    x = torch.randn(1, 24, model.config.hidden_size, requires_grad=True)
    positions = torch.arange(24)[None]
    rotary = decoder.rotary_emb(x, positions)

    def run(layer):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        out = out[0] if isinstance(out, tuple) else out
        trainable = [p for p in layer.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out.square().mean(), [x, *trainable])
        weights = {p.data_ptr() for p in layer.parameters()}
        return out, grads, sum(t.numel() * t.element_size() for t in kept if t.data_ptr() not in weights)

    eager = decoder.layers[0]
    out_ref, grads_ref, _ = run(eager)
    monkeypatch.setattr(fusion.FuseSharedInputLinears, "fused", 0)
    fused = copy.deepcopy(eager)
    _compile_region(fused, "inductor", None)
    out, grads, kept = run(fused)
    fused_calls = fusion.FuseSharedInputLinears.fused  # per compile: q/k/v, their A matrices, gate/up's A matrices
    assert fused_calls > 0 and fused_calls % (3 + 3 + 2) == 0  # (a compile a process's earlier tests made dynamic: 2)
    assert torch.allclose(out, out_ref, atol=1e-5)
    assert all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, grads_ref))
    monkeypatch.setattr(fusion, "ENABLED", False)
    plain = copy.deepcopy(eager)
    _compile_region(plain, "inductor", None)
    assert run(plain)[2] >= kept > 0
