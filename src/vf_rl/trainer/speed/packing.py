"""Micro batches: which samples go in which forward/backward pass, and the tensors of each
(:class:`MicroBatch`, packed or padded).

``RLTrainer._train_on_batch`` takes its micro batches from :func:`plan_micro_batches` and runs
every one the same way (``logprobs.micro_batch_logprobs``). With ``padding_free`` on:

1. **Packing** (:func:`plan_micro_batches`, :func:`pack_samples`, :func:`packed_micro_batch`):
   samples are grouped greedily in batch order into micro batches of at most a token budget
   (``micro_batch_tokens``, default ``micro_batch_size`` x the batch's mean sample length:
   :func:`default_token_budget`). A micro batch whose packed row saves at least
   ``PACK_MIN_SAVING`` of its padded tokens (:func:`should_pack`) is laid end to end in ONE row
   of ``N`` real tokens (no padding): ``position_ids`` restart at 0 for every sample, and
   attention stays inside each sample (``attention.py``). Others run as plain padded rows
   (:func:`padded_micro_batch`, ``logprobs.padded_policy_logprobs``), where the model's own
   attention kernel is faster.
2. **Shared prompts** (``share_prompts``): consecutive samples of one group (``Sample.group``,
   same first ``Sample.prompt_len`` tokens: the rollouts of one example) put that prompt in the
   row once; each completion continues at position ``prompt_len`` and attends to the one copy
   of the prompt's keys/values plus its own tokens. The prompt's hidden states are the same as
   in a per-sample forward (a causal prompt never sees its completion), and the gradients of
   every completion flow into the single prompt copy, so log-probs and gradients equal the
   plain forward's (tests/test_packing.py).

With ``padding_free`` off, every micro batch is ``micro_batch_size`` padded rows.

A packed micro batch's :class:`PackedLayout` describes its *segments* for the attention:
segment ``s`` has queries ``q[cu_q[s]:cu_q[s+1]]`` and keys ``k[key_index][cu_k[s]:cu_k[s+1]]``
(for a plain sample the keys are its own tokens; for a completion sharing a prompt, the
prompt's keys then its own).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress

import torch

from vf_rl.config.shape_grid import bucket
from vf_rl.orchestrator.samples import Sample
from vf_rl.trainer.batching import first_trained_position, host_tensor, micro_batches, shard

PACK_MIN_SAVING = 0.1
"""A micro batch runs as one packed row only when that removes at least this share of the
tokens its padded ``[B, L]`` form would forward (padding, or prompts computed once); otherwise
it runs padded (:func:`plan_micro_batches`): same log-probs and gradients, and the plain
attention kernel is faster where packing saves little."""

# --- packing ---------------------------------------------------------------------------------


def _shares_prompt(sample: Sample, prev: Sample | None, share_prompts: bool) -> bool:
    """Whether ``sample`` can reuse ``prev``'s prompt: same group, same prompt tokens, and the
    prompt holds no trained token (``loss_mask`` 0 on positions ``1 .. prompt_len - 1``)."""
    if not share_prompts or prev is None or sample.group < 0 or sample.group != prev.group:
        return False
    p = sample.prompt_len
    return (0 < p < len(sample.input_ids) and p == prev.prompt_len and p < len(prev.input_ids)
            and sample.input_ids[:p] == prev.input_ids[:p] and not any(sample.loss_mask[1:p]))


def pack_samples(samples: list[Sample], token_budget: int, share_prompts: bool = False,
                 max_samples: int | None = None) -> list[list[Sample]]:
    """Split ``samples`` (in order) into micro batches of at most ``token_budget`` real tokens
    (and at most ``max_samples`` samples, when given).

    A sample costs ``len(input_ids)`` tokens, or ``len(input_ids) - prompt_len`` when it
    shares the prompt of the sample before it in the same micro batch (``share_prompts``). A
    sample longer than the budget gets a micro batch of its own.

    Raises:
        ValueError: ``token_budget`` is not positive.
    """
    if token_budget <= 0:
        raise ValueError(f"micro_batch_tokens must be positive, got {token_budget}")
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    used = 0
    for s in samples:
        shared = _shares_prompt(s, current[-1] if current else None, share_prompts)
        cost = len(s.input_ids) - (s.prompt_len if shared else 0)
        if current and (used + cost > token_budget or (max_samples and len(current) >= max_samples)):
            batches.append(current)
            current, used, cost = [], 0, len(s.input_ids)
        current.append(s)
        used += cost
    if current:
        batches.append(current)
    return batches


def pack_for_rank(samples: list[Sample], world_size: int, rank: int, token_budget: int,
                  share_prompts: bool = False, max_samples: int | None = None) -> list[list[Sample]]:
    """This process's packed micro batches: samples dealt round-robin (process ``rank`` gets
    ``rank, rank + world_size, ...``, so a group's rollouts stay next to each other), packed,
    then padded with empty micro batches (one token, no loss) to the largest count over the
    processes, so every process runs the same number of forward/backward passes (DDP, ZeRO-3)."""
    packs = [pack_samples(samples[r::world_size], token_budget, share_prompts, max_samples) for r in range(world_size)]
    most = max(len(p) for p in packs)
    return packs[rank] + [[Sample([0], [0], [0.0], 0.0)] for _ in range(most - len(packs[rank]))]


def default_token_budget(samples: list[Sample], micro_batch_size: int) -> int:
    """The token budget per pass when ``micro_batch_tokens`` is unset: ``micro_batch_size`` x the
    batch's mean sample length (``ceil``), i.e. the real tokens of an average padded micro batch,
    so a pass never holds more activations than the padded path's average micro batch, while
    shared prompts (counted once) let more rollouts into it."""
    if not samples:
        return max(micro_batch_size, 1)
    return micro_batch_size * -(-sum(len(s.input_ids) for s in samples) // len(samples))


def packed_tokens(samples: list[Sample], share_prompts: bool = False) -> int:
    """Tokens of ``samples`` as one packed row (a shared prompt once), as :func:`packed_micro_batch`."""
    total, prev = 0, None
    for s in samples:
        total += len(s.input_ids) - (s.prompt_len if _shares_prompt(s, prev, share_prompts) else 0)
        prev = s
    return total


def should_pack(samples: list[Sample], share_prompts: bool = False, min_saving: float = PACK_MIN_SAVING) -> bool:
    """Whether ``samples`` run as one packed row (True) or padded ``[B, L]`` rows (False): pack
    when the packed row has at most ``1 - min_saving`` of the padded form's ``B * L`` tokens."""
    padded = len(samples) * max(len(s.input_ids) for s in samples)
    return packed_tokens(samples, share_prompts) <= (1.0 - min_saving) * padded


def plan_micro_batches(samples: list[Sample], world_size: int, rank: int, micro_batch_size: int,
                       micro_batch_tokens: int | None, share_prompts: bool, pad_token_id: int,
                       padding_free: bool = True, bucketed: bool = False,
                       always_pack: bool = False, max_seq_len: int = 0) -> list[MicroBatch]:
    """This process's micro batches of a batch (host tensors); packed ones bounded by
    ``max_seq_len`` (:func:`packed_micro_batch`).

    ``padding_free``: samples are packed greedily by a token budget (``micro_batch_tokens``,
    else :func:`default_token_budget` of the whole batch, the same on every process; see
    :func:`pack_for_rank`); each micro batch then runs packed (:func:`packed_micro_batch`) when
    :func:`should_pack`, else padded (:func:`padded_micro_batch`), or always packed with
    ``always_pack`` (compiled layers: one input form, so one graph to compile; packed rows never
    hold more tokens than padded ones). With ``bucketed`` (CUDA graphs, which replay one recorded
    graph per input shape) every micro batch runs packed, padded to bucket sizes
    (:func:`pad_to_buckets`): of the budget, so that a batch's last micro batch takes the shape of the
    others, except where the process's whole share is one micro batch (a budget from the mean
    sample counts each shared prompt once per sample, and reverse-text's one pass of 4-9k tokens
    was padded to ~20k). Otherwise: this process's shard
    (``batching.shard``) in padded micro batches of ``micro_batch_size`` samples.
    """
    if not padding_free:
        mine = shard(samples, world_size, rank, micro_batch_size)
        return [padded_micro_batch(mine[i:i + micro_batch_size], pad_token_id)
                for i in range(0, len(mine), micro_batch_size)]
    budget = micro_batch_tokens or default_token_budget(samples, micro_batch_size)
    packs = pack_for_rank(samples, world_size, rank, budget, share_prompts)
    if bucketed:  # a batch in one pass (per process) is padded to its own bucket, not the budget's
        target = budget if len(packs) > 1 else 0
        return [pad_to_buckets(packed_micro_batch(p, share_prompts, max_seq_len), pad_token_id, target) for p in packs]
    return [packed_micro_batch(p, share_prompts, max_seq_len) if always_pack or should_pack(p, share_prompts) else
            padded_micro_batch(p, pad_token_id) for p in packs]


def padded_micro_batch(samples: list[Sample], pad_token_id: int) -> MicroBatch:
    """``samples`` as right-padded ``[B, L]`` rows (host tensors): ``attention_mask`` None when
    no row is padded (attention is then plainly causal: no mask to build); the ``[B, T]``
    columns start at the batch's first trained position ``start`` (``T = L - start``), and the
    LM head runs from ``start - 1`` on (``keep``)."""
    mb = micro_batches(samples, len(samples), pad_token_id)[0]
    start = first_trained_position(mb["loss_mask"])
    lengths = {len(s.input_ids) for s in samples}
    return MicroBatch(input_ids=mb["input_ids"], targets=mb["input_ids"][:, start:],
                      loss_mask=mb["loss_mask"][:, start:], sampling_logprobs=mb["sampling_logprobs"][:, start:],
                      advantages=mb["advantages"], tokens=sum(len(s.input_ids) for s in samples),
                      attention_mask=mb["attention_mask"] if len(lengths) > 1 else None,
                      keep=mb["input_ids"].shape[1] - start + 1, samples=samples)


def first_trained(sample: Sample) -> int:
    """The first position ``>= 1`` whose token is trained (``len(input_ids)`` if none)."""
    mask = sample.loss_mask
    return next(compress(range(1, len(mask)), mask[1:]), len(sample.input_ids))


@dataclass
class PackedLayout:
    """Where each segment of a packed row attends (see the module docstring).

    Attributes:
        cu_q: ``[S + 1]`` int32, segment boundaries of the queries in the packed row.
        cu_k: ``[S + 1]`` int32, segment boundaries of the gathered keys.
        key_index: ``[K]`` long, packed-row position of each gathered key (the identity when no
            sample of the micro batch shares a prompt: one input form for compiled code), or
            None without ``share_prompts`` or when no sample has a group (``Sample.group`` -1:
            nothing can share a prompt, the keys are the row itself, ``cu_k == cu_q``).
        max_q: longest query segment (host int).
        max_k: longest key segment (host int).
        segments: host copy, ``(q_start, q_end, k_start, k_end)`` per segment.
        bound: a bound on every query and key segment's length that is the same for every micro
            batch of a run (``max_seq_len``), or 0 for none. Compiled layers pass the varlen kernel
            the row's lengths capped by it as the longest segments (``attention.py``); see
            :func:`packed_micro_batch`.
    """

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    key_index: torch.Tensor | None
    max_q: int
    max_k: int
    segments: list[tuple[int, int, int, int]]
    bound: int = 0


@dataclass
class MicroBatch:
    """One forward/backward pass: ``B`` samples, packed into one row or padded.

    Both forms give the loss ``[B, T]`` tensors whose column ``t`` of row ``b`` is trained-side
    token ``t`` of sample ``b`` (from its first trained position on).

    Attributes:
        input_ids: packed ``[1, N]`` long (``N`` real tokens), padded ``[B, L]`` long.
        targets: the tokens whose log-probs are taken: packed ``[M]`` long, padded ``[B, T]``.
        loss_mask: ``[B, T]`` bool.
        sampling_logprobs: ``[B, T]`` float32, the inference server's log-probs.
        advantages: ``[B]`` float32.
        tokens: real tokens forwarded (host int; a shared prompt counts once).
        layout: packed only: where each segment attends (:class:`PackedLayout`); its presence
            is what makes a micro batch packed (:attr:`packed`).
        position_ids: packed only, ``[1, N]`` long (restarting per sample).
        predict_index: packed only, ``[M]`` long, the row position whose hidden state predicts
            each target.
        valid: packed only, ``[B, T]`` bool, which cells hold one of the ``M`` targets.
        cells: packed only, ``[M]`` long, their flat indices in ``[B * T]``.
        attention_mask: padded only, ``[B, L]`` long, or None when no row is padded.
        keep: padded only, LM-head positions kept (``logits_to_keep``: ``L - start + 1``).
        samples: the samples it holds, in order (host; ``micro_step`` splits a pass that runs out of memory).
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor
    tokens: int
    layout: PackedLayout | None = None
    position_ids: torch.Tensor | None = None
    predict_index: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    cells: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    keep: int = 0
    samples: list[Sample] | None = None

    @property
    def packed(self) -> bool:
        """One packed row (per-sample attention, ``attention.py``) rather than padded rows."""
        return self.layout is not None


_LAYOUT_TENSORS = ("cu_q", "cu_k", "key_index")


def micro_batches_to(micro_batches: list[MicroBatch], device) -> list[MicroBatch]:
    """``micro_batches`` with every tensor (their layouts' too) on ``device``, in one copy per dtype:
    a dtype's host tensors are written into one buffer (pinned for a GPU, so the copy is
    asynchronous), each at a 16-byte aligned offset as kernels expect, copied, and read back in
    their shapes (:func:`_own_storage`: each over its own part of the buffer, at storage offset 0).
    A 64-rollout batch's eight packed micro batches hold ~90 tensors, whose copies one by one from
    pageable memory would each wait on the host at the step's start."""
    device = torch.device(device)
    found: dict[tuple[int, str, str | None], torch.Tensor] = {}  # (micro batch, field, layout field) -> tensor
    for i, mb in enumerate(micro_batches):
        for f in dataclasses.fields(mb):
            value = getattr(mb, f.name)
            if isinstance(value, torch.Tensor):
                found[(i, f.name, None)] = value
            elif isinstance(value, PackedLayout):
                for g in _LAYOUT_TENSORS:
                    if getattr(value, g) is not None:
                        found[(i, f.name, g)] = getattr(value, g)
    moved: dict[tuple[int, str, str | None], torch.Tensor] = {}
    for dtype in dict.fromkeys(t.dtype for t in found.values()):
        group = {where: t for where, t in found.items() if t.dtype == dtype}
        align = max(16 // dtype.itemsize, 1)  # elements in 16 bytes
        starts, end = {}, 0
        for where, t in group.items():
            starts[where], end = end, end + -(-t.numel() // align) * align
        flat = torch.empty(end, dtype=dtype, pin_memory=device.type == "cuda")
        for where, t in group.items():
            flat[starts[where]:starts[where] + t.numel()] = t.reshape(-1)
        flat = flat.to(device, non_blocking=True)
        moved.update({where: _own_storage(flat, starts[where], t.shape) for where, t in group.items()})
    out = []
    for i, mb in enumerate(micro_batches):
        fields = {f.name: moved.get((i, f.name, None), getattr(mb, f.name)) for f in dataclasses.fields(mb)}
        if mb.layout is not None:
            fields["layout"] = dataclasses.replace(mb.layout, **{g: moved[(i, "layout", g)] for g in _LAYOUT_TENSORS
                                                                 if (i, "layout", g) in moved})
        out.append(MicroBatch(**fields))
    return out


def _own_storage(flat: torch.Tensor, start: int, shape: torch.Size) -> torch.Tensor:
    """``flat[start:start + numel].view(shape)`` as a tensor of its own storage, a slice of ``flat``'s
    (the same memory, no copy; the slice keeps ``flat``'s allocation alive), at storage offset 0.

    A view's storage offset is its position in the buffer, which changes from step to step. dynamo
    gives the offset of a tensor with a dynamic size (the layout's ``cu_q``, ``cu_k``, ``key_index``,
    the row's ``position_ids``) a symbol of its own, guarded ``>= 2`` (or equal to a size of the same
    value), while an offset of 0 compiles as a constant with no guard. A compiled layer called on
    the same tensors at another offset, as the layer graphs' recording does on copies of its inputs
    (``layer_graphs.LayerGraphs``), then compiles again (seconds on a GPU, after the warm-up).
    At offset 0 every micro batch, copy and recording meets the warm-up's graphs."""
    itemsize = flat.element_size()
    part = flat.untyped_storage()[start * itemsize:(start + math.prod(shape)) * itemsize]
    return flat.new_empty(0).set_(part, 0, shape)


def packed_micro_batch(samples: list[Sample], share_prompts: bool = False, max_seq_len: int = 0) -> MicroBatch:
    """One packed micro batch of ``B`` samples (host tensors): column ``t`` of row ``b`` is
    token ``first_trained(sample_b) + t`` of sample ``b`` (``T`` = the longest such tail); the
    ``M`` targets in row-major order of ``valid``.

    ``max_seq_len`` (tokens, 0 for none) becomes the layout's ``bound`` when no segment is longer.
    The varlen kernel launches a block per 128 tokens of its longest-segment argument for every
    segment and head, most of which return at once; compiled code cannot pass each row's exact
    longest segments without compiling again per value, and with the row's length in their place
    attention took 57% of the GPU time of a SmolLM2-135M LoRA step on a 15k-token row of ~120-token
    samples (docs/benchmarks.md)."""
    ids, positions = [], []
    pos_maps: list[Sequence[int]] = []  # per sample, the row position of each of its tokens: its keys
    q_segments, k_bounds = [], [0]
    prev, prompt_at = None, 0  # the previous sample, and where its prompt starts in the row
    for s in samples:
        L = len(s.input_ids)
        start = len(ids)
        if _shares_prompt(s, prev, share_prompts):
            p = s.prompt_len
            ids += s.input_ids[p:]
            positions += range(p, L)
            pos_maps.append(list(range(prompt_at, prompt_at + p)) + list(range(start, start + L - p)))
        else:
            prompt_at = start
            ids += s.input_ids
            positions += range(L)
            pos_maps.append(range(start, start + L))
        q_segments.append((start, len(ids)))
        k_bounds.append(k_bounds[-1] + L)
        prev = s
    # rollouts of a real run always carry their group, so every micro batch of a run gathers (one
    # form); samples without one (SFT rows, distinct prompts) never share and skip the gather
    gathers = share_prompts and any(s.group >= 0 for s in samples)
    starts = [first_trained(s) for s in samples]
    T = max(len(s.input_ids) - st for s, st in zip(samples, starts))
    B = len(samples)
    valid = torch.zeros(B, T, dtype=torch.bool)
    predict, targets, cells, masks, sampled = [], [], [], [], []
    for b, (s, st, pm) in enumerate(zip(samples, starts, pos_maps)):
        n = len(s.input_ids) - st
        valid[b, :n] = True
        cells += range(b * T, b * T + n)
        masks += s.loss_mask[st:]
        sampled += s.sampling_logprobs[st:]
        predict += pm[st - 1:len(s.input_ids) - 1]
        targets += s.input_ids[st:]
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    sampling = torch.zeros(B, T, dtype=torch.float32)
    loss_mask[valid] = host_tensor(masks, torch.bool)  # row-major, as ``cells``
    sampling[valid] = host_tensor(sampled, torch.float32)
    segments = [(q0, q1, k0, k1) for (q0, q1), k0, k1 in zip(q_segments, k_bounds[:-1], k_bounds[1:])]
    layout = PackedLayout(
        cu_q=host_tensor([0] + [q1 for _, q1 in q_segments], torch.int32),
        cu_k=host_tensor(k_bounds, torch.int32),
        key_index=host_tensor(list(chain.from_iterable(pos_maps)), torch.long) if gathers else None,
        max_q=max(q1 - q0 for q0, q1 in q_segments), max_k=max(b - a for a, b in zip(k_bounds, k_bounds[1:])),
        segments=segments)
    if max_seq_len and max(layout.max_q, layout.max_k) <= max_seq_len:
        layout.bound = max_seq_len
    return MicroBatch(input_ids=host_tensor([ids], torch.long), targets=host_tensor(targets, torch.long),
                      loss_mask=loss_mask, sampling_logprobs=sampling,
                      advantages=host_tensor([s.advantage for s in samples], torch.float32), tokens=len(ids),
                      layout=layout, position_ids=host_tensor([positions], torch.long),
                      predict_index=host_tensor(predict, torch.long), valid=valid, cells=host_tensor(cells, torch.long),
                      samples=samples)


# --- bucketed shapes (CUDA graphs) --------------------------------------------------------------


def pad_to_buckets(mb: MicroBatch, pad_token_id: int, token_budget: int = 0) -> MicroBatch:
    """``mb`` (packed, host tensors) padded to a few input shapes, so that CUDA graphs
    (``torch_compile_mode = "reduce-overhead"``), one recorded graph per shape, replay instead of
    recording again: its row length ``N`` to :func:`~.shape_grid.bucket` of the packing's ``token_budget``
    (of ``N`` itself when longer: one sample over the budget), its segment count ``S`` to a power
    of two, its gathered keys ``K`` (shared prompts) to a :func:`bucket` size.

    A micro batch already of those sizes (a row of the budget's bucket, segments a power of two,
    keys a bucket size: fixed-length batches) is returned as it is. Else the padding is ``d >= 1``
    segments of ``pad_token_id`` appended to the row (positions from 0, each attending to itself
    and, when keys are gathered, to extra copies of its first key that fill ``K``): the first ones
    as long as the layout's ``bound`` lets their keys be, the rest one token each (``d`` doubles
    until the bound holds them). They are never predicted from nor targets (``predict_index``,
    ``targets``, the ``[B, T]`` tensors and ``tokens`` are ``mb``'s), so log-probs, loss and
    gradients are ``mb``'s (tests/test_packing.py); the cost is their forward, at most an eighth
    of a full row's length in tokens past the padding segments' one token each (a micro batch
    short of the budget, the last of a batch, is padded to it)."""
    layout = mb.layout
    n, s = mb.input_ids.shape[1], layout.cu_q.shape[0] - 1
    shared = layout.key_index is not None
    k = int(layout.cu_k[-1])
    if n == bucket(max(n, token_budget), 64) and s == bucket(s, 4, per_octave=1) and (not shared or k == bucket(k, 64)):
        return mb
    cap = layout.bound if layout.bound >= 2 else 0  # each padding segment's keys within the bound
    d = bucket(s + 1, 4, per_octave=1) - s
    while True:
        pad = bucket(max(n + d, token_budget), 64) - n
        extra = bucket(k + pad, 64) - k - pad if shared else 0
        if not cap or pad + extra <= d * cap:
            break
        d = bucket(s + d + 1, 4, per_octave=1) - s  # twice the segments
    q_bounds, k_bounds, key_index, positions, segments = [], [], [], [], list(layout.segments)
    limit = cap or pad + extra  # without a bound, the first segment takes all
    q0, k0, left = n, k, extra
    for j in range(d):  # the first segments as long as the limit lets them, the rest one token
        length = min(limit, pad - (q0 - n) - (d - 1 - j))
        more = min(limit - length, left)
        left -= more
        segments.append((q0, q0 + length, k0, k0 + more + length))
        key_index += [q0] * more + list(range(q0, q0 + length))
        positions += range(length)
        q0, k0 = q0 + length, k0 + more + length
        q_bounds.append(q0)
        k_bounds.append(k0)
    added = segments[s:]
    padded = PackedLayout(
        cu_q=torch.cat([layout.cu_q, torch.tensor(q_bounds, dtype=layout.cu_q.dtype)]),
        cu_k=torch.cat([layout.cu_k, torch.tensor(k_bounds, dtype=layout.cu_k.dtype)]),
        key_index=torch.cat([layout.key_index, torch.tensor(key_index, dtype=torch.long)]) if shared else None,
        max_q=max([layout.max_q] + [b - a for a, b, _, _ in added]),
        max_k=max([layout.max_k] + [b - a for _, _, a, b in added]), segments=segments,
        bound=layout.bound if cap else 0)
    return dataclasses.replace(
        mb, layout=padded, input_ids=torch.cat([mb.input_ids, torch.full((1, pad), pad_token_id, dtype=torch.long)], 1),
        position_ids=torch.cat([mb.position_ids, torch.tensor([positions], dtype=mb.position_ids.dtype)], 1))
