"""No recompilation after the warm-up: the trainer's compiled layers (inductor on the CPU), warmed up by
``warmup.warm_up``, then trained on packed micro batches of realistic steps through the trainer's own
``plan_micro_batches``, ``micro_batches_to`` and layer graphs, compile nothing more, and every step's
metrics say so (``compile/recompiles``)."""

import random

import torch
from test_compile import _cpu_varlen


def _graphs_on_the_cpu(monkeypatch, recorded: list) -> None:
    """The GPU's path through ``layer_graphs.LayerGraphs`` on the CPU: the varlen kernel (a stand-in)
    and a recording at a shape's second pass, whose capture runs what ``make_graphed_callables`` runs
    before capturing: a forward and backward of the layers on copies of the pass's tensors (the
    recording's sample inputs, at storage offset 0); its replays run the layers on their inputs."""
    from vf_rl.trainer.speed import attention, layer_graphs

    monkeypatch.setattr(attention, "_VARLEN", _cpu_varlen()[0])
    monkeypatch.setattr(attention, "_VARLEN_PARAMS", ("is_causal",))
    monkeypatch.setattr(attention, "varlen_applies", lambda query, dropout=0.0: True)
    monkeypatch.setattr(layer_graphs, "varlen_applies", lambda query, dropout=0.0: True)

    def make_graphed_callables(stack, sample, pool=None):
        out = stack(*sample)
        wrt = [t for t in sample if t.requires_grad] + [p for p in stack.parameters() if p.requires_grad]
        torch.autograd.grad(out.float().square().mean(), wrt, allow_unused=True)
        recorded.append(sample[0].shape[1])
        return stack

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", make_graphed_callables)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def _step_samples(rng: random.Random, rows: list[dict], tokenizer, step: int, groups: int, rollouts: int,
                  max_prompt: int, max_tokens: int):
    """A step's samples as the orchestrator makes them: ``groups`` dataset prompts (templated, their last
    ``max_prompt`` tokens), ``rollouts`` completions each of 1 to ``max_tokens`` tokens."""
    from vf_rl.orchestrator.samples import Sample, prompt_ids

    samples = []
    for g in range(groups):
        prompt = prompt_ids(tokenizer, rows[(step * groups + g) % len(rows)]["prompt"])[-rng.randint(4, max_prompt):]
        for _ in range(rollouts):
            n = rng.randint(1, max_tokens)
            ids = prompt + [rng.randrange(10, 1000) for _ in range(n)]
            samples.append(Sample(ids, [0] * len(prompt) + [1] * n, [0.0] * len(ids), rng.gauss(0.0, 1.0), group=g,
                                  prompt_len=len(prompt)))
    return samples


def test_steps_after_the_warm_up_compile_nothing(model_dir, tmp_path, monkeypatch):
    """A LoRA model's decoder layers compiled with inductor and recorded as layer graphs
    (``torch_compile_mode = "reduce-overhead"``, what one trainer GPU runs by default; the recording on
    the CPU as in :func:`_graphs_on_the_cpu`), warmed up, then 24 steps of 4 x 4 rollouts whose
    prompts, completions, micro batches (row lengths, segments, gathered keys) and so the tensors'
    places in ``micro_batches_to``'s buffers vary from step to step: no frame compiles again (the
    layer graphs' recordings, on copies of a pass's tensors, included) and each step's metrics log
    ``compile/recompiles`` 0; a compile after the warm-up counts."""
    from torch._dynamo.utils import counters
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer import micro_step as trainer_module
    from vf_rl.trainer.speed.warmup import compile_metrics, warm_up

    recorded: list[int] = []
    _graphs_on_the_cpu(monkeypatch, recorded)
    moved = []  # per step, each micro batch's row length, segments + 1, gathered keys and key_index's place

    def micro_batches_to(micro_batches, device):
        out = to_device(micro_batches, device)
        first = out[0].input_ids.data_ptr()  # the int64 buffer's start (key_index's place: its offset as a view)
        moved.append([(mb.input_ids.shape[1], mb.layout.cu_q.shape[0], mb.layout.key_index.shape[0],
                       (mb.layout.key_index.data_ptr() - first) // 8) for mb in out])
        return out

    to_device = trainer_module.micro_batches_to
    monkeypatch.setattr(trainer_module, "micro_batches_to", micro_batches_to)
    autocast_cache = torch.is_autocast_cache_enabled()  # record_layer_graphs turns it off for the process
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=32, num_eval_examples=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=len(tokenizer),
                                         pad_token_id=tokenizer.pad_token_id))
    args = RLConfig(output_dir=str(tmp_path / "out"), use_cpu=True, batch_size=16, rollouts_per_example=4,
                    micro_batch_size=4, max_seq_len=64, max_tokens=32, max_steps=100, report_to=[], use_lora=True,
                    lora_rank=4, lora_alpha=8, torch_compile=True, torch_compile_mode="reduce-overhead")
    torch._dynamo.reset()  # no sizes or graphs left by other tests' compiles of the same layer code
    try:
        trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t")
        assert trainer.cuda_graphs
        assert warm_up(trainer) is not None
        warm_frames = counters["frames"]["total"]
        assert warm_frames > 0 and compile_metrics(trainer) == {"compile/recompiles": 0.0}
        moved.clear()
        rng = random.Random(0)
        for step in range(24):
            samples = _step_samples(rng, trainer._rows, tokenizer, step, groups=4, rollouts=4, max_prompt=32,
                                    max_tokens=32)
            batch = Batch(step=step, samples=samples, rollouts=[], metrics={})
            _, stats = trainer._train_on_batch(trainer.model, batch)  # plan, one copy per dtype, the layers
            trainer._timings, trainer._started = {"train_s": 1.0}, 0.0
            trainer._record(batch, stats)  # the step's metrics
            assert trainer._step_metrics["compile/recompiles"] == 0.0, f"step {step + 1} compiled again"
        assert counters["frames"]["total"] == warm_frames
        assert len(recorded) >= 2, recorded  # layer graphs recorded (on the CPU: ran the layers on their copies)
        passes = [mb for step in moved for mb in step]
        assert len({len(step) for step in moved}) > 1 and all(len({mb[i] for mb in passes}) > 2 for i in range(4)), moved
        torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
        assert compile_metrics(trainer) == {"compile/recompiles": 1.0}
    finally:
        torch.set_autocast_cache_enabled(autocast_cache)
        torch._dynamo.reset()

