"""The run config's sections, one per consumer: each is read once from the resolved trainer
arguments (an ``RLConfig``) and handed to its consumer whole, frozen.

The trainer itself reads ``RLConfig``; the orchestrator, which runs in a process of its own,
takes :class:`OrchestratorConfig` (it is sent there once, so it holds plain values only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FilteringConfig:
    """Online difficulty filtering (``use_difficulty_filtering``; DAPO's dynamic sampling,
    arXiv:2503.14476): the keys of ``orchestrator/filtering.py``'s ``DifficultyFilter``."""

    threshold: float = 0.0
    min_reward: float | None = None
    max_reward: float | None = None
    oversampling_factor: float = 1.0
    max_rounds: int = 4
    seed: int = 0


@dataclass(frozen=True)
class OrchestratorConfig:
    """What the orchestrator reads of the run config.

    Attributes:
        batch_size: rollouts per batch; ``batch_size // rollouts_per_example`` rows each.
        rollouts_per_example: rollouts per prompt (the group size).
        sampling_args: chat-completion arguments (``RLConfig.sampling_args``).
        max_seq_len: samples are cut to this many tokens.
        max_concurrent: most rollouts in flight.
        generation_timeout: seconds allowed for one batch; rollouts still running then are
            counted as errors.
        request_timeout: seconds allowed for one request to the server.
        stall_warning_timeout, stall_timeout: seconds a wait on the orchestrator may go without
            progress before the watchdog's line, and before the run stops (``vf_rl.watchdog``).
        mask_truncated_completions: truncated completions (cut at ``max_tokens``, or longer than
            ``max_seq_len``) get no loss tokens.
        zero_truncated_completions: truncated completions get reward 0.
        mask_env_responses: environment-written tokens get no loss (multi-turn).
        filtering: difficulty filtering's keys, or ``None`` (off).
    """

    batch_size: int
    rollouts_per_example: int
    sampling_args: dict = field(default_factory=dict)
    max_seq_len: int = 2048
    max_concurrent: int = 1024
    generation_timeout: float = 600.0
    request_timeout: float = 600.0
    stall_warning_timeout: float = 120.0
    stall_timeout: float = 480.0
    mask_truncated_completions: bool = False
    zero_truncated_completions: bool = False
    mask_env_responses: bool = True
    filtering: FilteringConfig | None = None

    @classmethod
    def from_args(cls, args: Any) -> "OrchestratorConfig":
        """The section of resolved trainer arguments ``args`` (an ``RLConfig``)."""
        filtering = (FilteringConfig(args.difficulty_threshold, args.difficulty_min_reward, args.difficulty_max_reward,
                                     args.oversampling_factor, args.max_filter_rounds, args.seed)
                     if args.use_difficulty_filtering else None)
        return cls(batch_size=args.batch_size, rollouts_per_example=args.rollouts_per_example,
                   sampling_args=args.sampling_args(), max_seq_len=args.max_seq_len,
                   max_concurrent=args.max_concurrent, generation_timeout=args.generation_timeout,
                   request_timeout=args.request_timeout, stall_warning_timeout=args.stall_warning_timeout,
                   stall_timeout=args.stall_timeout, mask_truncated_completions=args.mask_truncated_completions,
                   zero_truncated_completions=args.zero_truncated_completions,
                   mask_env_responses=args.mask_env_responses, filtering=filtering)
