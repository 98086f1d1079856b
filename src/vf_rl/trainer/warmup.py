"""The first step's compile, moved ahead of its rollouts.

With ``torch_compile`` the decoder layers (or the stack, as CUDA graphs) compile at their first
forward and backward. ``RLTrainer.train`` runs those on a small synthetic batch before the first
step: while vf-vllm starts when the trainer has GPUs of its own, else (one GPU for both) once
vLLM is up, while the first batch generates (vLLM sizes its KV cache from the GPU's used memory
as it starts, other processes' allocations counted as its own: ``vllm/utils/mem_utils.py``).
Step 1 then trains at once instead of compiling after its rollouts arrive (on an H200, 21 s
per-layer, 111 s as CUDA graphs for SmolLM2-135M; benchmarks/RESULTS.md, al).

The layers compile with dynamic shapes (``model.py``), so a batch of any lengths compiles the
graphs that real batches reuse; what has to match is the input form (packed or padded rows,
shared prompts, the reference model's no-grad pass, bucket padding for CUDA graphs). So the
synthetic batch goes through the trainer's own ``_train_on_batch``: groups of
``rollouts_per_example`` samples sharing a prompt from the dataset, completions of different
lengths. Its gradients are dropped and the RNG state restored: the run goes on as it would have.
"""

from __future__ import annotations

import time

import torch

from .batching import Sample, prompt_ids
from .orchestrator import Batch

COMPLETION_TOKENS = (5, 17, 33, 64)  # different lengths, so micro batches pack as real ones do


def synthetic_batch(rows: list[dict], tokenizer, max_seq_len: int, max_tokens: int | None,
                    rollouts_per_example: int, groups: int = 2) -> Batch:
    """A batch shaped like a real one: ``groups`` (at most ``len(rows)``) groups of
    ``min(rollouts_per_example, 4)`` samples, each group's templated prompt from ``rows`` (its
    last tokens, at most half of ``max_seq_len``), completions of :data:`COMPLETION_TOKENS`
    lengths (capped by ``max_tokens`` and ``max_seq_len``) made of the prompt's token ids.
    Sampling log-probs are 0, advantages alternate between 1 and -1.
    """
    samples = []
    for g, row in enumerate(rows[:groups]):
        prompt = prompt_ids(tokenizer, row["prompt"])[-max(max_seq_len // 2, 1):]
        for i in range(min(rollouts_per_example, 4)):
            n = max(1, min(COMPLETION_TOKENS[i], max_tokens or COMPLETION_TOKENS[i], max_seq_len - len(prompt)))
            completion = [prompt[(i + j) % len(prompt)] for j in range(n)]
            samples.append(Sample(input_ids=prompt + completion, loss_mask=[0] * len(prompt) + [1] * n,
                                  sampling_logprobs=[0.0] * (len(prompt) + n), advantage=1.0 - 2 * (i % 2),
                                  group=g, prompt_len=len(prompt)))
    return Batch(step=0, samples=samples, rollouts=[], metrics={})


def warm_up(trainer) -> float | None:
    """One ``trainer._train_on_batch`` on :func:`synthetic_batch`, then every gradient set to
    ``None`` and torch's RNG (CPU and the trainer's GPU) as before. A failure is printed as one
    line and leaves the compile to the first step.

    Returns:
        the seconds it took (compiling included), or ``None`` when it failed.
    """
    a, model = trainer.args, trainer.model
    rows = trainer._rows or trainer._eval_rows
    batch = synthetic_batch(rows, trainer.processing_class, a.max_seq_len, a.max_tokens, a.rollouts_per_example)
    main = trainer.is_world_process_zero()
    start = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=[a.device] if a.device.type == "cuda" else []):
            trainer._train_on_batch(model, batch)
        if a.device.type == "cuda":
            torch.cuda.synchronize(a.device)
    except Exception as e:  # noqa: BLE001 - the run can still compile at its first step
        if main:
            print(f"torch_compile: compiling on a synthetic batch failed ({type(e).__name__}: {e}); "
                  "the first step compiles instead", flush=True)
        return None
    finally:
        model.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    if main:
        print(f"torch_compile: compiled in {seconds:.1f} s on a synthetic batch of "
              f"{sum(len(s.input_ids) for s in batch.samples)} tokens", flush=True)
    return seconds
