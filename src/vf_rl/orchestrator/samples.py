"""From scored rollouts to training samples, in the orchestrator's process (no torch).

A rollout's turns become :class:`Sample` s (token ids, loss mask, sampling log-probs, advantage),
merged where each turn's prompt extends the previous tokens; ``trainer/batching.py`` and
``trainer/speed/packing.py`` lay them out as micro batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


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
