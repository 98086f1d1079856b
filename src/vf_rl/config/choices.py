"""The run's choices as tagged unions: one key picks an option, each option declares the keys it reads.

A choice is a ``[trainer.args]`` key whose value picks an option (``loss_type = "cispo"``).
Each option is a pydantic model holding only the keys that option reads, tagged by the choice
key's value, and a choice is the discriminated union of its options. A key of another option
(``epsilon_high``, DAPO's clip, with ``loss_type = "cispo"``) would be ignored silently, so it is
refused: the options forbid extra keys. :func:`run_choices` builds the options a run uses from the
flat, resolved trainer arguments; the keys stay flat in the TOML, as the seeds name them.

A key counts as set when its value differs from its default: RLArgs' defaults fill every key.
A ``"module:function"`` loss may read every loss key; a ``"module:function"`` advantage reads
none of vf-rl's keys (it gets the whole config).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError

from vf_rl.config.args import rl_fields
from vf_rl.config.errors import ConfigError


class Option(BaseModel):
    """One option of a choice: its tag (the choice key) and the keys it reads, nothing else.
    A built-in loss or advantage also names its function (``function``, ``"module:function"``):
    its option here is its registration."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    function: ClassVar[str | None] = None


# loss_type (algorithm/loss.py)
class CispoLoss(Option):
    """CISPO (MiniMax-M1, arXiv:2506.13585): importance-ratio masking outside [low, high]."""

    function = "vf_rl.algorithm.loss:cispo_loss"
    loss_type: Literal["cispo"]
    mask_ratio_low: float
    mask_ratio_high: float


class DapoLoss(Option):
    """PPO/GRPO clipped surrogate with DAPO's clip-higher (arXiv:2503.14476)."""

    function = "vf_rl.algorithm.loss:dapo_loss"
    loss_type: Literal["dapo"]
    epsilon_low: float
    epsilon_high: float


class GrpoLoss(Option):
    """TRL's "grpo": the clipped surrogate, each sample's token mean, then the mean over samples (arXiv:2402.03300)."""

    function = "vf_rl.algorithm.loss:grpo_loss"
    loss_type: Literal["grpo"]
    epsilon_low: float
    epsilon_high: float


class DrGrpoLoss(Option):
    """TRL's "dr_grpo": the clipped surrogate summed over tokens, over samples x max_tokens (arXiv:2503.20783)."""

    function = "vf_rl.algorithm.loss:dr_grpo_loss"
    loss_type: Literal["dr_grpo"]
    epsilon_low: float
    epsilon_high: float


class BnpoLoss(Option):
    """TRL's "bnpo": the clipped surrogate's token mean over each trainer process's share."""

    function = "vf_rl.algorithm.loss:bnpo_loss"
    loss_type: Literal["bnpo"]
    epsilon_low: float
    epsilon_high: float


class GspoLoss(Option):
    """GSPO (arXiv:2507.18071): the clipped surrogate of each sample's sequence-level ratio."""

    function = "vf_rl.algorithm.loss:gspo_loss"
    loss_type: Literal["gspo"]
    epsilon_low: float
    epsilon_high: float


class CustomLoss(Option):
    """``"module:function"``: a loss of the user's; it may read every loss key."""

    loss_type: str
    mask_ratio_low: float
    mask_ratio_high: float
    epsilon_low: float
    epsilon_high: float


# advantage_type (algorithm/advantage.py)
class GroupMeanAdvantage(Option):
    """The reward minus its group's mean (Dr. GRPO, arXiv:2503.20783)."""

    function = "vf_rl.algorithm.advantage:group_mean"
    advantage_type: Literal["group_mean"]


class GroupMeanStdAdvantage(Option):
    """The reward minus its group's mean, over the group's standard deviation (GRPO, arXiv:2402.03300)."""

    function = "vf_rl.algorithm.advantage:group_mean_std"
    advantage_type: Literal["group_mean_std"]


class CustomAdvantage(Option):
    advantage_type: str


# weight_sync (trainer/weight_sync.py; "auto" is resolved per layout by rules.choose_weight_sync)
class AutoSync(Option):
    weight_sync: Literal["auto"]
    weight_sync_port: int
    weight_sync_bucket_mb: int


class FilesystemSync(Option):
    weight_sync: Literal["filesystem"]


class NcclSync(Option):
    weight_sync: Literal["nccl"]
    weight_sync_port: int
    weight_sync_bucket_mb: int


class IpcSync(Option):
    weight_sync: Literal["ipc"]
    weight_sync_bucket_mb: int


class LoraSync(Option):
    weight_sync: Literal["lora"]


# use_difficulty_filtering (orchestrator/filtering.py)
class NoFiltering(Option):
    use_difficulty_filtering: Literal[False]


class DifficultyFiltering(Option):
    """DAPO's dynamic sampling (arXiv:2503.14476): zero-spread groups dropped and refilled."""

    use_difficulty_filtering: Literal[True]
    difficulty_threshold: float
    difficulty_min_reward: float | None
    difficulty_max_reward: float | None
    oversampling_factor: float
    max_filter_rounds: int


# padding_free (trainer/speed/packing.py): the micro-batch layout
class PaddedMicroBatches(Option):
    padding_free: Literal[False]


class PackedMicroBatches(Option):
    padding_free: Literal[True]
    micro_batch_tokens: int | None
    share_prompts: bool


@dataclass(frozen=True)
class Choice:
    """A choice: its key and its options. An option whose key is a plain ``str`` (not a
    ``Literal``) is the ``"module:function"`` option, taken by any value no other option has."""

    key: str
    options: tuple[type[Option], ...]

    def tag(self, option: type[Option]) -> str:
        """The option's tag: ``repr`` of its value (``"'cispo'"``, ``"True"``), or ``"custom"``."""
        args = typing.get_args(option.model_fields[self.key].annotation)
        return repr(args[0]) if args else "custom"

    def pick(self, value: Any) -> str:
        """The tag of the option ``value`` takes (a tag no option has when none takes it)."""
        tags = [self.tag(o) for o in self.options]
        return repr(value) if repr(value) in tags or "custom" not in tags else "custom"

    def option(self, value: Any) -> type[Option] | None:
        return next((o for o in self.options if self.tag(o) == self.pick(value)), None)

    @property
    def union(self) -> Any:
        """The discriminated union of the options (the value of ``key`` picks one)."""
        members = tuple(Annotated[o, Tag(self.tag(o))] for o in self.options)
        return Annotated[Union[members], Discriminator(self._discriminate)]  # noqa: UP007

    def _discriminate(self, data: Any) -> str:
        return self.pick(data[self.key] if isinstance(data, dict) else getattr(data, self.key))

    def own_keys(self) -> set[str]:
        return {k for o in self.options for k in o.model_fields if k != self.key}


CHOICES = {
    "loss": Choice("loss_type", (CispoLoss, DapoLoss, GrpoLoss, DrGrpoLoss, BnpoLoss, GspoLoss, CustomLoss)),
    "advantage": Choice("advantage_type", (GroupMeanAdvantage, GroupMeanStdAdvantage, CustomAdvantage)),
    "weight_sync": Choice("weight_sync", (AutoSync, FilesystemSync, NcclSync, IpcSync, LoraSync)),
    "filtering": Choice("use_difficulty_filtering", (NoFiltering, DifficultyFiltering)),
    "micro_batches": Choice("padding_free", (PaddedMicroBatches, PackedMicroBatches)),
}


def builtin_functions(choice: str) -> dict[str, str]:
    """The built-in options of ``choice`` (``"loss"``, ``"advantage"``) that name a function:
    ``{value: "module:function"}``, in their declared order."""
    found = CHOICES[choice]
    return {typing.get_args(o.model_fields[found.key].annotation)[0]: o.function
            for o in found.options if o.function is not None}


Loss = CHOICES["loss"].union
Advantage = CHOICES["advantage"].union
WeightSync = CHOICES["weight_sync"].union
Filtering = CHOICES["filtering"].union
MicroBatches = CHOICES["micro_batches"].union


class RunChoices(BaseModel):
    """The options a run uses, one per choice (``run_choices``)."""

    model_config = ConfigDict(frozen=True)

    loss: Loss
    advantage: Advantage
    weight_sync: WeightSync
    filtering: Filtering
    micro_batches: MicroBatches


@lru_cache(maxsize=None)
def _adapter(name: str) -> TypeAdapter:
    return TypeAdapter(CHOICES[name].union)


def run_choices(a: dict[str, Any], p: str = "") -> RunChoices:
    """The run's option of each choice, from the resolved trainer arguments ``a``.

    Args:
        a: every RLArgs key (resolved: defaults filled in).
        p: the prefix of key names in messages (``"trainer.args."`` for a TOML file).
    Raises:
        ConfigError: a key set (not at its default) that the chosen option does not read,
            naming the key, the options that read it and the run's choice; or a value of the
            wrong type for its option.
    """

    defaults = {name: f.default for name, f in rl_fields().items()}
    picked = {}
    for name, choice in CHOICES.items():
        value = a[choice.key]
        option = choice.option(value)
        if option is None:
            tags = ", ".join(choice.tag(o) for o in choice.options)
            raise ConfigError(f"{p}{choice.key}: expected one of {tags}, got {_toml(value)}")
        data = {k: a[k] for k in choice.own_keys() | {choice.key} if k in option.model_fields or a[k] != defaults[k]}
        try:
            picked[name] = _adapter(name).validate_python(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][-1]) if err["loc"] else choice.key
            if err["type"] == "extra_forbidden":
                owners = " or ".join(_toml(typing.get_args(o.model_fields[choice.key].annotation)[0])
                                     for o in choice.options if key in o.model_fields and choice.tag(o) != "custom")
                raise ConfigError(f"{p}{key} applies only with {p}{choice.key} = {owners} (this run has "
                                  f"{_toml(value)}), where it would be ignored; remove it or change "
                                  f"{choice.key}") from None
            raise ConfigError(f"{p}{key}: {err['msg']}, got {err.get('input')!r}") from None
    return RunChoices(**picked)


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)
