"""RLConfig: the trainer's arguments (``[trainer.args]`` in a vf-rl TOML).

vf-rl's own fields (:class:`~vf_rl.config.args.RLArgs`) on top of
``transformers.TrainingArguments``, so every TrainingArguments field works too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from vf_rl.config.args import SAMPLING_DEFAULTS, RLArgs, SamplingArgs, rl_fields
from vf_rl.config.defaults import DERIVED_FROM, origin, resolve_trainer_args
from vf_rl.config.errors import suggest
from vf_rl.config.rules import check_trainer_args, check_types, trl_name_hint

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class RLConfig(RLArgs, TrainingArguments):
    """Arguments of :class:`vf_rl.RLTrainer`: :class:`~vf_rl.config.args.RLArgs`' fields and
    ``transformers.TrainingArguments``'.

    Units: lengths in tokens, timeouts in seconds, ``batch_size`` and ``micro_batch_size``
    in rollouts (samples). ``__post_init__`` maps the older key names, checks types and the rules
    between keys with the same code as the TOML path (``config/rules.py``), fills the derived
    defaults (``defaults.resolve_trainer_args``) and raises ``ConfigError`` (a ``ValueError``)
    naming the key; an unknown keyword raises ``TypeError`` with TRL's name of the key or the
    nearest name (``RLConfig(max_completion_length=...)`` points to ``max_tokens``). Sampling keys
    left ``None`` are filled by the trainer from the environment
    (else ``args.SAMPLING_DEFAULTS``).
    """

    def __new__(cls, *args, **kwargs):
        # an unknown keyword gets the TOML path's hints (TRL's name of a key, the nearest name) in
        # place of the dataclass's bare "unexpected keyword argument"
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        for key in kwargs.keys() - known:
            hint = trl_name_hint(key) or suggest(key, known)
            raise TypeError(f"RLConfig: unknown argument '{key}'{hint}")
        return super().__new__(cls)

    def __post_init__(self):
        import importlib.util
        import os

        import torch

        if self.deepspeed and importlib.util.find_spec("deepspeed") is None:
            raise ValueError("deepspeed: a DeepSpeed config needs the deepspeed package (pip install 'vf-rl[deepspeed]')")
        if self.wandb:
            unknown = set(self.wandb) - {"project", "name", "entity", "tags", "group"}
            if unknown:
                raise ValueError(f"wandb: unknown keys {sorted(unknown)} (expected project, name, entity, tags, group)")
            for key in ("project", "entity", "name"):
                if self.wandb.get(key):
                    os.environ.setdefault(f"WANDB_{key.upper()}", str(self.wandb[key]))
        names = [f.name for f in dataclasses.fields(RLArgs)]  # vf-rl's keys and the older names
        check_types({k: getattr(self, k) for k in rl_fields() if k not in ("lora_config", "wandb")})
        given = {name: getattr(self, name) for name in names}
        for name in given.keys() - rl_fields().keys():
            setattr(self, name, None)  # an older name is read once, here
        given |= {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingArguments)
                  if f.init and f.name not in given}
        has_gpu = torch.cuda.is_available() and not self.use_cpu
        # trainer processes as launchers set them (accelerate, torchrun); checked again once known below
        resolved = resolve_trainer_args(given, has_gpu, int(os.environ.get("WORLD_SIZE") or 1))
        check_trainer_args(resolved, 1, has_gpu)  # before TrainingArguments' own checks, so the messages agree
        self.origins = {key: origin(key, resolved[key], resolved[key] != f.default and not (
            key in DERIVED_FROM and given.get(key) is None), "set") for key, f in rl_fields().items()}
        """Where each of vf-rl's keys came from (``resolved.toml`` of a Python run says it)."""
        for key in rl_fields():
            setattr(self, key, resolved[key])
        self.torch_compile_mode = resolved["torch_compile_mode"]  # TrainingArguments' key, derived with the rest
        if self.lora_target_modules is None:
            self.lora_target_modules = list(DEFAULT_LORA_TARGETS)
        self.gradient_accumulation_steps = 1
        self.per_device_train_batch_size = self.micro_batch_size
        super().__post_init__()
        if self.world_size > 1:  # known only now
            if self.torch_compile_mode == "reduce-overhead" and given.get("torch_compile_mode") is None:
                self.torch_compile_mode = resolved["torch_compile_mode"] = None  # derived for one process
            check_trainer_args(resolved, self.world_size, has_gpu)

    def server_urls(self) -> list[str]:
        """Base URLs of the inference servers: ``vllm_server_urls``, or the one server at
        ``vllm_server_host:vllm_server_port``."""
        return list(self.vllm_server_urls or [f"http://{self.vllm_server_host}:{self.vllm_server_port}"])

    def sampling_args(self) -> SamplingArgs:
        """OpenAI chat-completion arguments for rollouts (vLLM extras under ``extra_body``). The
        keys left ``None`` get their built-in default (``SAMPLING_DEFAULTS``; ``max_tokens``:
        ``max_seq_len``) and are marked as defaults, which an environment's own sampling
        arguments replace (``envs.environment.merge_sampling_args``)."""
        builtin = {**SAMPLING_DEFAULTS, "max_tokens": self.max_seq_len}
        top = ("max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty")
        extra_keys = ("min_p", "repetition_penalty", "top_k")
        unset = {k for k in (*top, *extra_keys) if getattr(self, k) is None}
        values = {k: builtin[k] if k in unset else getattr(self, k) for k in top}
        values["extra_body"] = {k: builtin[k] if k in unset else getattr(self, k)
                                for k in extra_keys if k in builtin or k not in unset}
        defaults = {k for k in top if k in unset} | {f"extra_body.{k}" for k in extra_keys if k in unset}
        return SamplingArgs(values, defaults)


def resolve_temperature(args: RLConfig, env: Any) -> None:
    """``args.temperature`` left ``None``: the environment's sampling temperature, else
    ``SAMPLING_DEFAULTS``' 1.0 (``env``: an environment or a mixture of them). The trainer's
    log-probs use it too (the importance ratio compares log-probs at one temperature).

    Raises:
        ValueError: the environments of a mixture ask for different temperatures."""
    if args.temperature is not None:
        return
    envs = list(getattr(env, "envs", {}).values()) or [env]
    asked = {e.sampling_args["temperature"] for e in envs if "temperature" in (getattr(e, "sampling_args", None) or {})}
    if len(asked) > 1:
        raise ValueError(f"the environments ask for different temperatures ({sorted(asked)}); set "
                         "trainer.args.temperature")
    args.temperature = asked.pop() if asked else SAMPLING_DEFAULTS["temperature"]
