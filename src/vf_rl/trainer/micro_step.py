"""One step's micro batches: forward, loss and backward over each, and what a micro batch that
runs out of GPU memory costs (a split, not the run).

:func:`train_on_batch` plans this process's micro batches (``speed/packing.py``), copies them to
the device and runs each: log-probs, the loss (``algorithm/loss.py``), backward. Gradients add
up in the parameters' ``.grad`` over the micro batches; ``Trainer`` then clips and steps.

**Out of memory** (``torch.OutOfMemoryError``) in a micro batch's forward or backward, with one
trainer process: the micro batch is split in two at a sample boundary (about half its tokens
each, in the form it had: a packed row becomes two packed rows, padded rows two sets of padded
rows) and the halves run in its place. The step's gradient is unchanged: every micro batch is
divided by the same normaliser (the whole batch's loss tokens) and gets the same batch totals,
and every built-in loss is a sum of per-token terms that depend on their own sample and those
totals only (``micro_batch_loss``), so any split of the samples sums to the same loss.

- Out of memory in the **forward** leaves the gradients as they were (a forward writes no
  ``.grad``): only that micro batch is run again, as its halves.
- Out of memory in the **backward** can leave part of that micro batch's gradient accumulated
  (autograd adds each parameter's gradient as it reaches it). Gradients hold only this step's
  micro batches (``Trainer`` sets them to ``None`` after every optimizer step, and vf-rl has no
  gradient accumulation across steps), so they are set to ``None`` and the step's micro batches
  run again from the first, with the failed one split: exact, for one more pass over the micro
  batches before it (a rare event's cost, where a copy of the gradients before every backward
  would cost their memory at every step).

Either way a line ``[vf-rl] out of memory on a micro batch of N tokens (S samples); split into 2
and retried`` is printed, ``oom/splits`` counts the splits (since the process started), and from
then on a micro batch of at least the size that failed is split before it runs. A micro batch of
one sample cannot be split: :class:`OutOfMemoryStop`, one line naming the sample's length and the
keys to change; the trainer saves the last complete step's checkpoint and ``vf-train`` exits with
status 4. With ``[inference] shared`` vLLM's share of the GPU (``gpu_memory_utilization``) stays
fixed: the trainer's micro batches split within the rest. With several trainer processes (DDP,
ZeRO-3) a split would change the passes one process runs under collectives the others wait in, so
out of memory stops the run there (:class:`OutOfMemoryStop`, naming the micro-batch keys).

CUDA's out of memory cannot happen on the CPU; tests make it with ``VF_RL_FAIL_ALLOC_ABOVE_TOKENS``
(:data:`FAIL_ALLOC_ENV`): ``K`` raises ``torch.OutOfMemoryError`` in the forward of every micro batch
over ``K`` tokens, ``K:backward`` in its backward, after its first parameter gradient was added.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os

import torch

from vf_rl.algorithm.loss import BatchTotals, LossInputs, micro_batch_loss
from vf_rl.trainer.model import lora_input_casts_off, train_mode
from vf_rl.trainer.reference import reference_logprobs
from vf_rl.trainer.speed.logprobs import micro_batch_logprobs
from vf_rl.trainer.speed.packing import (
    MicroBatch,
    micro_batches_to,
    packed_micro_batch,
    pad_to_buckets,
    padded_micro_batch,
    plan_micro_batches,
)

FAIL_ALLOC_ENV = "VF_RL_FAIL_ALLOC_ABOVE_TOKENS"
"""Test hook (the module docstring): ``K`` or ``K:backward``, a simulated out of memory for micro batches over ``K`` tokens."""


class OutOfMemoryStop(RuntimeError):
    """Out of memory that no split can avoid: one sample alone, or several trainer processes.
    Its message is the one line to show (the sample's length, the keys to change)."""


def train_on_batch(trainer, model, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward, loss and backward over this process's micro batches of ``batch``, splitting any
    that runs out of memory (module docstring).

    Args:
        trainer: the ``RLTrainer`` (its args, accelerator, loss, reference model, tokenizer).
        model: the model being trained (as ``Trainer`` passes it).
        batch: the step's ``Batch`` (its samples).
    Returns:
        ``(loss, stats)``: the summed loss (detached, 0-d) and the step statistics: the loss function's
        (``loss.py`` says the convention), ``tokens/loss``, ``tokens/trained`` (forwarded: no padding, a shared prompt once).
    Raises:
        OutOfMemoryStop: a sample alone does not fit (or out of memory with several processes).
    """
    a = trainer.args
    loss_tokens = sum(sum(s.loss_mask[1:]) for s in batch.samples)
    normalizer = max(loss_tokens, 1) / a.world_size
    # everything the micro batches need from the host is read and copied before the first
    # forward, so no copy or host read waits for queued GPU work inside the loop
    on_host = plan_micro_batches(batch.samples, a.world_size, a.process_index, a.micro_batch_size,
                                 a.micro_batch_tokens, a.share_prompts, trainer.processing_class.pad_token_id,
                                 a.padding_free, trainer.cuda_graphs, bool(a.torch_compile), a.max_seq_len)
    my_loss_tokens = sum(int(mb.loss_mask.sum()) for mb in on_host)
    totals = BatchTotals(loss_tokens, sum(any(s.loss_mask[1:]) for s in batch.samples), my_loss_tokens, a.world_size)
    todo = micro_batches_to(on_host, a.device)  # one copy per dtype
    # a backward that fails can be undone only when the gradients held nothing before this step
    fresh = all(p.grad is None for p in model.parameters())
    sums: dict[str, torch.Tensor] = {}  # statistics stay on the device until after the last backward
    total_loss = torch.zeros((), device=a.device)
    train_mode(model)  # the flags only where an evaluation left them off (model.py)
    i = 0
    with lora_input_casts_off(model, trainer.accelerator.native_amp):  # exact, fewer copies (model.py)
        while i < len(todo):
            limit = getattr(trainer, "_oom_tokens", None)
            if limit is not None and todo[i].input_ids.numel() >= limit and len(todo[i].samples or ()) > 1:
                todo[i:i + 1] = _split(trainer, todo[i])  # the size that ran out of memory before
                continue
            done, failed = _forward_backward(trainer, model, todo[i], i == len(todo) - 1, normalizer, totals)
            if failed is None:
                total_loss += done[0]
                for k, v in done[1].items():
                    v = v.detach().float()
                    sums[k] = torch.maximum(sums[k], v) if k in sums and k.endswith("/max") else sums.get(k, 0.0) + v
                i += 1
                continue
            mb = todo[i]
            _free_memory(a.device)
            if a.world_size > 1 or len(mb.samples or ()) <= 1 or (failed == "backward" and not fresh):
                raise OutOfMemoryStop(_stop_line(trainer, mb, failed, fresh))
            trainer._oom_tokens = min(limit or mb.input_ids.numel(), mb.input_ids.numel())
            todo[i:i + 1] = _split(trainer, mb)
            again = "; the step's micro batches run again (its backward had begun)" if failed == "backward" else ""
            print(f"[vf-rl] out of memory on a micro batch of {mb.input_ids.numel()} tokens ({len(mb.samples)} "
                  f"samples); split into 2 and retried{again}", flush=True)
            if failed == "backward":  # its gradient may be partly added: undo the step's, run it again
                model.zero_grad(set_to_none=True)
                sums, total_loss, i = {}, torch.zeros((), device=a.device), 0
    totals = dict(zip(sums, torch.stack(list(sums.values())).tolist())) if sums else {}  # one host read
    n = max(my_loss_tokens, 1)
    stats = {k: v if k.endswith("/max") else v / n for k, v in totals.items()}
    return total_loss, {**stats, "tokens/loss": float(my_loss_tokens), "tokens/trained": float(sum(mb.tokens for mb in todo))}


def _forward_backward(trainer, model, mb: MicroBatch, last: bool, normalizer: float, totals: BatchTotals):
    """One micro batch's forward, loss and backward. Returns ``((loss, stats), None)``, or
    ``(None, "forward" | "backward")`` where it ran out of memory. Returning (not retrying
    inside the ``except``) lets the failed pass's tensors go with this frame and the traceback."""
    a = trainer.args
    # gradients are all-reduced (DDP) and the optimizer steps (DeepSpeed, whose backward steps
    # it) once per batch, after the last micro batch
    trainer.accelerator.sync_gradients = last
    with contextlib.nullcontext() if last else trainer.accelerator.no_sync(model):
        try:
            with trainer.compute_loss_context_manager():
                if (error := _simulated(mb, "forward")) is not None:
                    raise error

                def policy(m):  # log-probs and entropy [B, T] of this micro batch under m
                    return micro_batch_logprobs(m, mb, a.temperature)

                ref = (reference_logprobs(trainer.accelerator.unwrap_model(model), trainer.ref_model,
                                          lambda m: policy(m)[0]) if a.beta > 0 else None)
                logprobs, entropy = policy(model)
                inputs = LossInputs(logprobs, mb.sampling_logprobs, mb.advantages, mb.loss_mask, entropy, ref, totals)
                loss, stats = micro_batch_loss(trainer.loss_fn, inputs, a, normalizer)  # mask, KL, / N
                del logprobs, entropy, inputs, ref  # the graph lives on in loss only
        except torch.OutOfMemoryError:
            return None, "forward"
        try:
            with _failing_backward(model, mb):
                trainer.accelerator.backward(loss)
        except torch.OutOfMemoryError:
            return None, "backward"
    return (loss.detach(), stats), None  # this graph gone before the next forward (layer_graphs)


def _split(trainer, mb: MicroBatch) -> list[MicroBatch]:
    """``mb``'s samples as two micro batches on the device, of about half its tokens each (cut at
    the sample boundary that best balances them), in ``mb``'s form; ``oom/splits`` counts it."""
    a, samples = trainer.args, mb.samples
    prefix = list(itertools.accumulate(len(s.input_ids) for s in samples))
    cut = min(range(1, len(samples)), key=lambda k: abs(2 * prefix[k - 1] - prefix[-1]))
    pad = trainer.processing_class.pad_token_id
    if mb.packed:
        pieces = [packed_micro_batch(p, a.share_prompts, a.max_seq_len) for p in (samples[:cut], samples[cut:])]
        if trainer.cuda_graphs:  # each half padded to its own bucket (not the budget's: that is what failed)
            pieces = [pad_to_buckets(p, pad, 0) for p in pieces]
    else:
        pieces = [padded_micro_batch(p, pad) for p in (samples[:cut], samples[cut:])]
    trainer._oom_splits = getattr(trainer, "_oom_splits", 0) + 1
    return micro_batches_to(pieces, a.device)


def _free_memory(device) -> None:
    """After an out of memory: collect what the failed pass left in reference cycles and hand the
    allocator's cached blocks back, so the halves start from unfragmented memory."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _stop_line(trainer, mb: MicroBatch, failed: str, fresh: bool) -> str:
    """The one line of an :class:`OutOfMemoryStop`: what failed and the keys to change."""
    a, size = trainer.args, mb.input_ids.numel()
    if a.world_size > 1:
        return (f"out of memory in the {failed} of a micro batch of {size} tokens ({len(mb.samples or ())} samples) with "
                f"{a.world_size} trainer processes (micro batches are split only with one); lower "
                "trainer.args.micro_batch_tokens (or micro_batch_size with padding_free = false)")
    if not fresh:
        return (f"out of memory in the backward of a micro batch of {size} tokens, with gradients held from before "
                "this step (nothing to undo it to); lower trainer.args.micro_batch_tokens")
    shared = trainer.server_shares_gpu
    share = (f", or give vLLM less of the GPU (inference.args.gpu_memory_utilization"
             f"{f', now {shared}' if not isinstance(shared, bool) else ''})" if shared else "")
    return (f"out of memory in the {failed} of one sample of {len(mb.samples[0].input_ids)} tokens (a micro batch of "
            f"one sample cannot be split); lower trainer.args.max_seq_len (now {a.max_seq_len}) or max_tokens, or "
            f"turn on gradient_checkpointing, activation_offloading or tiled_mlp{share}")


def oom_metrics(trainer) -> dict[str, float]:
    """``{"oom/splits": n}``: micro batches split since the process started, after running out of
    memory or for being at least the size that did (0 in a run that never ran out)."""
    return {"oom/splits": float(getattr(trainer, "_oom_splits", 0))}


def save_last_complete_step(trainer) -> None:
    """After an :class:`OutOfMemoryStop`: the failed step's partial gradient and the allocator's
    cache let go, then ``trainer.save_on_stop()`` (``checkpoints.py``: the last complete step,
    which the failed step did not change), its outcome printed in one line."""
    trainer.model.zero_grad(set_to_none=True)  # the failed step's partial gradient: memory, and not saved
    _free_memory(trainer.args.device)
    print(f"[vf-rl] {trainer.save_on_stop()}", flush=True)


def _simulated(mb: MicroBatch, phase: str) -> torch.OutOfMemoryError | None:
    """The test hook (:data:`FAIL_ALLOC_ENV`): the error to raise in ``phase`` when it is set for
    that phase and ``mb`` has more than its ``K`` tokens, else ``None``."""
    spec = os.environ.get(FAIL_ALLOC_ENV)
    size, at = mb.input_ids.numel(), (spec or "").partition(":")
    if spec and (at[2] or "forward") == phase and size > int(at[0]):
        return torch.OutOfMemoryError(f"{FAIL_ALLOC_ENV}={spec}: simulated out of memory on {size} tokens")
    return None


@contextlib.contextmanager
def _failing_backward(model, mb: MicroBatch):
    """With :data:`FAIL_ALLOC_ENV` ``K:backward`` and ``mb`` over ``K`` tokens: a backward that raises
    ``torch.OutOfMemoryError`` when its second parameter gradient is added (the first one already
    is: a partial gradient, as a real out of memory in the middle of a backward leaves). Else nothing."""
    error, added = _simulated(mb, "backward"), []
    if error is None:
        yield
        return

    def hook(p):
        added.append(p)
        if len(added) == 2:
            raise error

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
