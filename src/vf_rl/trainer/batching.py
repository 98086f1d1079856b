"""From scored rollouts to padded micro-batch tensors.

Pure functions over lists and tensors: rollouts (with their advantages, ``advantage.py``) ->
training samples -> per-process shard -> micro batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Sample:
    """One training sequence (one model turn of a rollout).

    Attributes:
        input_ids: prompt + completion token ids, ``len = L``.
        loss_mask: ``len = L``, 1 on completion tokens trained on, 0 on prompt tokens.
        sampling_logprobs: ``len = L``, the server's log-prob of each token (0 on prompt).
        advantage: the rollout's advantage (same for every token).
        group: index of the example whose rollouts this sample belongs to (rollouts of one
            group share their prompt), -1 if unknown.
        prompt_len: the first ``prompt_len`` tokens are the group's prompt, the same for every
            rollout of the group (0: none known). Used by ``share_prompts`` (``packing.py``).
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    advantage: float
    group: int = -1
    prompt_len: int = 0


_NUMPY_DTYPES = {torch.long: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.bool: np.bool_}


def host_tensor(values, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``values`` (a list of numbers, or of equal-length lists) with ``dtype``,
    through numpy: ``torch.tensor`` reads a Python list ~3x slower (~55 against ~16 ns a number),
    and a 64 x 512-token batch's micro batches convert ~150k numbers at every step's start."""
    return torch.from_numpy(np.asarray(values, dtype=_NUMPY_DTYPES[dtype]))


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The token ids of ``messages`` under the tokenizer's chat template, generation prompt added."""
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def prompt_rows(dataset, tokenizer, max_prompt_len: int, shuffle_seed: int | None = None) -> list[dict]:
    """The rows of ``dataset`` whose templated prompt (chat template, generation prompt added)
    fits ``max_prompt_len`` tokens, each with its dataset index as ``row_id``; shuffled once by
    ``shuffle_seed`` unless it is ``None``. Batch ``n`` takes the ``n``-th slice of this list
    (``orchestrator.batch_rows``), so the rows of every step follow from the dataset and the seed."""
    from vf_rl.env_api.environment import prompt_messages

    rows = []
    for i, row in enumerate(dataset):
        row = {**row, "prompt": prompt_messages(row["prompt"])}  # a plain-string prompt is one user message
        if len(prompt_ids(tokenizer, row["prompt"])) <= max_prompt_len:
            rows.append({**row, "row_id": i})
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    return rows


def rollout_to_samples(turns, advantage: float, max_seq_len: int, mask_env_responses: bool = True,
                       group: int = -1) -> list[Sample]:
    """Training samples of one rollout's turns (objects with ``prompt_ids``, ``completion_ids``,
    ``completion_logprobs``).

    Consecutive turns are merged into one sample while each turn's ``prompt_ids`` starts with
    the previous sample's tokens exactly (the chat template re-rendered the history token for
    token): one forward pass instead of one per turn. Tokens between two model turns (the
    environment's reply, template tokens) get loss mask 0 when ``mask_env_responses``, else 1
    with a NaN sampling log-prob (the loss then uses an importance ratio of 1 for them). A turn
    whose prompt rewrote the history (e.g. a template that drops ``<think>`` blocks) starts a
    new sample. The first sample gets ``group`` and its first turn's prompt length as
    ``prompt_len``; later samples (a rewritten history) get neither.
    """
    samples: list[Sample] = []
    current: Sample | None = None
    for turn in turns:
        prompt, completion = list(turn.prompt_ids), list(turn.completion_ids)
        if current is not None and prompt[:len(current.input_ids)] == current.input_ids:
            extra = prompt[len(current.input_ids):]
            current.input_ids += extra + completion
            current.loss_mask += [0 if mask_env_responses else 1] * len(extra) + [1] * len(completion)
            current.sampling_logprobs += ([0.0] if mask_env_responses else [float("nan")]) * len(extra)
            current.sampling_logprobs += list(turn.completion_logprobs)
        else:
            if current is not None:
                samples.append(current)
            current = Sample(prompt + completion, [0] * len(prompt) + [1] * len(completion),
                             [0.0] * len(prompt) + list(turn.completion_logprobs), advantage)
    if current is not None:
        samples.append(current)
    if samples:
        samples[0].group, samples[0].prompt_len = group, min(len(turns[0].prompt_ids), max_seq_len)
    cut = []
    for s in samples:
        s.input_ids, s.loss_mask, s.sampling_logprobs = (s.input_ids[:max_seq_len], s.loss_mask[:max_seq_len],
                                                         s.sampling_logprobs[:max_seq_len])
        if any(s.loss_mask):
            cut.append(s)
    return cut


def exceeds_max_seq_len(turns, max_seq_len: int) -> bool:
    """Whether :func:`rollout_to_samples` would cut this rollout's tokens at ``max_seq_len``:
    some turn's prompt + completion is longer (a merged sample is as long as its last turn's
    prompt + completion, since each turn's prompt repeats the history)."""
    return any(len(t.prompt_ids) + len(t.completion_ids) > max_seq_len for t in turns)


def shard(samples: list[Sample], world_size: int, rank: int, micro_batch_size: int) -> list[Sample]:
    """This process's share of ``samples``, padded so every process gets the same number of
    micro batches (padding samples carry no loss tokens).

    Samples are dealt round-robin: process ``rank`` gets samples ``rank, rank + world_size, ...``.
    """
    per_step = world_size * micro_batch_size
    padded = list(samples)
    filler = Sample([0], [0], [0.0], 0.0)
    while len(padded) % per_step:
        padded.append(filler)
    return padded[rank::world_size]


def first_trained_position(loss_mask: torch.Tensor) -> int:
    """The first position ``>= 1`` where any row of a ``[B, L]`` loss mask is set (1 if none):
    positions before it need no logits. Call it on the host copy (on a GPU it would sync)."""
    trained = loss_mask[:, 1:].any(dim=0).nonzero()
    return int(trained[0]) + 1 if len(trained) else 1


def micro_batches(samples: list[Sample], micro_batch_size: int, pad_token_id: int) -> list[dict[str, torch.Tensor]]:
    """Right-pad samples into micro batches of ``micro_batch_size``.

    Returns:
        A list of dicts with ``input_ids`` ``[B, L]`` long, ``attention_mask`` ``[B, L]``
        long, ``loss_mask`` ``[B, L]`` bool, ``sampling_logprobs`` ``[B, L]`` float32 and
        ``advantages`` ``[B]`` float32, where ``L`` is the longest sample in that micro batch.
    """
    batches = []
    for start in range(0, len(samples), micro_batch_size):
        chunk = samples[start:start + micro_batch_size]
        length = max(len(s.input_ids) for s in chunk)

        def pad(values, fill):
            return [list(v) + [fill] * (length - len(v)) for v in values]

        batches.append({
            "input_ids": host_tensor(pad([s.input_ids for s in chunk], pad_token_id), torch.long),
            "attention_mask": host_tensor(pad([[1] * len(s.input_ids) for s in chunk], 0), torch.long),
            "loss_mask": host_tensor(pad([s.loss_mask for s in chunk], 0), torch.bool),
            "sampling_logprobs": host_tensor(pad([s.sampling_logprobs for s in chunk], 0.0), torch.float32),
            "advantages": host_tensor([s.advantage for s in chunk], torch.float32),
        })
    return batches


class StepsDataset(torch.utils.data.Dataset):
    """Placeholder data for ``Trainer``'s loop: one item per process per step. Real batches
    come from the orchestrator."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        return {"step": i}
