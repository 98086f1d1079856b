"""The first step's compile, moved ahead of its rollouts.

With ``torch_compile`` the decoder layers (or the stack, as CUDA graphs) compile at their first
forward and backward, with a packed row's sizes dynamic (``model.py``; any other size that
changes turns dynamic at a second compile, dynamo's automatic dynamic shapes).
``RLTrainer.train`` runs that on small synthetic batches before the first step: while vf-vllm
starts when the trainer has GPUs of its own, else (one GPU for both) once vLLM holds its share of
the GPU (:func:`server_memory_taken`: vLLM sizes its KV cache from the GPU's used memory as it
starts, other processes' allocations counted as its own, ``vllm/utils/mem_utils.py``; its graph
capture and warm-up come after that allocation), or
once it is up where that cannot be seen, while the first batch generates. Step 1 then trains at once instead of
compiling after its rollouts arrive (``docs/benchmarks.md`` gives the time to the first step).

What a later step reuses is the graph of each input form (packed rows, shared prompts, the
reference model's no-grad pass, bucket padding for CUDA graphs) with dynamic sizes. So the
synthetic batches go through the trainer's own ``_train_on_batch``: groups of samples sharing
a prompt from the dataset, completions of different lengths, the second batch far shorter and
with fewer samples (row length, segment count and gathered keys all change, so a size the
first compile left static compiles here, not in a step). Their gradients are dropped and the
RNG state restored: the run goes on as it would have. After it, a step should compile nothing:
:func:`compile_metrics` counts what dynamo compiles from then on (``compile/recompiles`` in
every step's metrics).
"""

from __future__ import annotations

import sys
import time

import torch

from vf_rl.inference.supervision import check_server_alive
from vf_rl.orchestrator.orchestrator import Batch
from vf_rl.orchestrator.samples import Sample, prompt_ids

SHAPES = (((5, 17, 33, 64), 2, None), ((1, 3, 2), 1, 8))
"""The synthetic batches: (completion lengths in tokens, one group's sample per length up to
``rollouts_per_example``; number of groups; the prompts' last tokens kept, None: half of
``max_seq_len``). The second is much shorter than the first (its row, padded to a bucket size
with CUDA graphs, lands in another size) and has fewer samples per group."""


def synthetic_batch(rows: list[dict], tokenizer, max_seq_len: int, max_tokens: int | None,
                    rollouts_per_example: int, lengths: tuple[int, ...] = SHAPES[0][0],
                    groups: int = SHAPES[0][1], prompt_tokens: int | None = None) -> Batch:
    """A batch shaped like a real one: ``groups`` groups (the prompts of ``rows``, cycled) of
    ``min(rollouts_per_example, len(lengths))`` samples, each group's templated prompt (its last
    ``prompt_tokens``, at most half of ``max_seq_len``), completions of ``lengths`` tokens
    (capped by ``max_tokens`` and ``max_seq_len``) made of the prompt's token ids. Sampling
    log-probs are 0, advantages alternate between 1 and -1.
    """
    keep = max(min(prompt_tokens or max_seq_len, max_seq_len // 2), 1)
    samples = []
    for g in range(groups):
        prompt = prompt_ids(tokenizer, rows[g % len(rows)]["prompt"])[-keep:]
        for i in range(min(rollouts_per_example, len(lengths))):
            n = max(1, min(lengths[i], max_tokens or lengths[i], max_seq_len - len(prompt)))
            completion = [prompt[(i + j) % len(prompt)] for j in range(n)]
            samples.append(Sample(input_ids=prompt + completion, loss_mask=[0] * len(prompt) + [1] * n,
                                  sampling_logprobs=[0.0] * (len(prompt) + n), advantage=1.0 - 2 * (i % 2),
                                  group=g, prompt_len=len(prompt)))
    return Batch(step=0, samples=samples, rollouts=[], metrics={})


SHARE_REACHED = 0.9
"""vLLM holds its share once the GPU memory other processes use reaches this much of it (its KV cache,
the bulk of the share, allocated; the weights and the profiling pass before it stay below)."""
SHARE_GROWN = 0.5
"""...and once at least this much of the share appeared after the trainer's first reading: memory an
unrelated process held already is not vLLM's (counted, it would start the compile while vLLM profiles,
which then sizes its KV cache around the trainer's allocations). A trainer whose first reading comes after
vLLM allocated its cache waits for the server to answer instead, as without the signal."""


def server_memory_taken(trainer, poll_s: float = 0.5) -> bool:
    """``[inference] shared``: wait until the memory the trainer's GPU gives other processes (its
    total less the free and what this process's allocator reserves) reaches :data:`SHARE_REACHED` of
    vLLM's ``gpu_memory_utilization`` share (``trainer.server_shares_gpu``, a float; ``True``: not
    known), :data:`SHARE_GROWN` of it since the first reading, so that compiling now cannot shrink
    vLLM's KV cache.

    Returns:
        True when it did; False when the share is not known, the trainer is not on a GPU, or a
        server answers first (compile after it, as without the signal).
    Raises:
        TimeoutError, ServerExited: as ``InferenceClient.wait_until_ready`` after
            ``vllm_server_timeout`` seconds, or when the server ``vf-rl`` launched exited.
    """
    share, device = trainer.server_shares_gpu, trainer.args.device
    if share is True or not share or device.type != "cuda":
        return False
    start, first = time.perf_counter(), None
    while True:
        free, total = torch.cuda.mem_get_info(device)
        others = total - free - torch.cuda.memory_reserved(device)
        first = others if first is None else first
        if others >= SHARE_REACHED * share * total and others - first >= SHARE_GROWN * share * total:
            if trainer.is_world_process_zero():
                print(f"vf-vllm holds {others / 2**30:.1f} GiB of this GPU after {time.perf_counter() - start:.1f} s: "
                      "compiling while it finishes starting", flush=True)
            return True
        if any(server.is_healthy() for server in trainer.servers):
            return False
        if time.perf_counter() - start > trainer.args.vllm_server_timeout:
            trainer.servers[0].wait_until_ready(0)  # raises its TimeoutError (or ServerExited)
        check_server_alive()
        time.sleep(poll_s)


def warm_up(trainer) -> float | None:
    """``trainer._train_on_batch`` on each :data:`SHAPES` batch (:func:`synthetic_batch`), then
    every gradient set to ``None`` and torch's RNG (CPU and the trainer's GPU) as before, once per
    trainer (a later call returns None at once). A failure is printed as one line and leaves the
    compile to the first step.

    Returns:
        the seconds it took (compiling included), or ``None`` when it failed or had run.
    """
    if getattr(trainer, "_warmed_up", False):
        return None
    trainer._warmed_up = True
    a, model = trainer.args, trainer.model
    rows = trainer._rows or trainer._eval_rows
    batches = [synthetic_batch(rows, trainer.processing_class, a.max_seq_len, a.max_tokens, a.rollouts_per_example,
                               *shape) for shape in SHAPES]
    main = trainer.is_world_process_zero()
    start = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=[a.device] if a.device.type == "cuda" else []):
            for batch in batches:
                trainer._train_on_batch(model, batch)
        if a.device.type == "cuda":
            torch.cuda.synchronize(a.device)
    except Exception as e:  # noqa: BLE001 - the run can still compile at its first step
        if main:
            print(f"torch_compile: compiling on synthetic batches failed ({type(e).__name__}: {e}); "
                  "the first step compiles instead", flush=True)
        return None
    finally:
        model.zero_grad(set_to_none=True)
        trainer._frames_at_warm_up = _compiled_frames()
    seconds = time.perf_counter() - start
    if main:
        print(f"torch_compile: compiled in {seconds:.1f} s on synthetic batches of "
              f"{sum(len(s.input_ids) for b in batches for s in b.samples)} tokens", flush=True)
    return seconds


def _compiled_frames() -> int:
    """Frames dynamo has compiled in this process (``counters["frames"]["total"]``: every first call
    of a compiled function and every recompile after a guard failed), 0 when dynamo was never loaded."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["frames"]["total"]) if utils is not None else 0


def compile_metrics(trainer) -> dict[str, float]:
    """``{"compile/recompiles": n}``: the frames dynamo compiled since :func:`warm_up` ended (since the
    process started where no warm-up ran), for every step's metrics. 0 all along once the warm-up
    compiled every graph the steps run; each compile in a step costs seconds of training on a GPU
    (a guard that failed: ``TORCH_LOGS=recompiles`` names it)."""
    return {"compile/recompiles": float(max(_compiled_frames() - getattr(trainer, "_frames_at_warm_up", 0), 0))}
