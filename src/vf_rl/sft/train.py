"""Supervised warm-up before RL (``vf-sft``): fine-tune a model on prompt/completion rows with
TRL's ``SFTTrainer`` and write a model directory that an RL config names as ``model``.

Rows come from a file or dataset (``[data]``), or from an environment (``[env]``): its training
prompts exactly as RL will send them (system prompt, few-shot turns, question), each with the
row's ``completion`` when the environment has one, else its ``answer`` written in the format the
environment's parser reads (``Parser.format_answer``: for reverse-text,
``<reversed_text>...</reversed_text>``). The loss covers the completion tokens only.

LoRA adapters are merged into the base weights before saving, so the output is a plain
transformers model directory (weights, config, tokenizer) that vLLM and ``vf-train`` load.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import typing
from pathlib import Path
from typing import Any

from vf_rl.config.packages import require
from vf_rl.config.rules import ConfigError, suggest

OWN_KEYS = {"use_lora": True, "lora_rank": 16, "lora_alpha": 32.0, "lora_dropout": 0.0, "lora_target_modules": None,
            "max_seq_len": 1024, "num_examples": -1}
"""vf-sft's own ``[trainer.args]`` keys and their defaults (the rest are ``trl.SFTConfig`` fields)."""
OWN_TYPES = {"use_lora": bool, "lora_rank": int, "lora_alpha": float, "lora_dropout": float,
             "lora_target_modules": list[str] | str | None, "max_seq_len": int, "num_examples": int}
DEFAULTS = {"learning_rate": 2e-4, "num_train_epochs": 1.0, "per_device_train_batch_size": 8, "logging_steps": 1,
            "save_strategy": "no", "report_to": "none", "lr_scheduler_type": "constant"}
"""SFTConfig defaults that differ from TRL's for a short warm-up."""


def conversation_rows(rows, parser=None) -> list[dict]:
    """Prompt/completion rows in TRL's conversational format (``{"prompt": [messages],
    "completion": [assistant message]}``) from rows of any of these shapes:

    - ``messages``: a chat; everything before the last assistant message is the prompt;
    - ``prompt`` and ``completion``: each a string or a message list (a string prompt is one
      user message, a string completion one assistant message);
    - ``prompt`` and ``answer`` (an environment's rows): the completion is
      ``parser.format_answer(answer)``.

    Raises:
        ConfigError: a row has none of these shapes (names the row and its columns).
    """
    out = []
    for i, row in enumerate(rows):
        if row.get("messages"):
            messages = list(row["messages"])
            last = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
            if last is None:
                raise ConfigError(f"row {i}: 'messages' has no assistant message to learn")
            prompt, completion = messages[:last], [messages[last]]
        elif "prompt" in row and (row.get("completion") is not None or row.get("answer") not in (None, "")):
            prompt = row["prompt"]
            completion = row.get("completion")
            if completion is None:
                text = str(row["answer"])
                completion = parser.format_answer(text) if parser is not None else text
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            completion = ([{"role": "assistant", "content": completion}] if isinstance(completion, str)
                          else list(completion))
        else:
            raise ConfigError(f"row {i}: expected 'messages', or 'prompt' with 'completion' or 'answer'; "
                              f"columns: {sorted(row)}")
        out.append({"prompt": [dict(m) for m in prompt], "completion": [dict(m) for m in completion]})
    return out


def load_rows(data: dict | None, env: dict | None) -> list[dict]:
    """The SFT rows of ``[data]`` (``path``: a ``.jsonl``/``.json`` file, a local dataset
    directory or a hub dataset id; ``split``, default ``train``) or of ``[env]`` (``id``,
    ``args``), as :func:`conversation_rows` returns them.

    Raises:
        ConfigError: neither or both given, a missing file, or rows of an unknown shape.
    """
    if (data is None) == (env is None):
        raise ConfigError("give either [data] (path = file or dataset) or [env] (id = environment), not "
                          + ("both" if data is not None else "neither"))
    if env is not None:
        from vf_rl.env_api import load_environment

        try:
            environment = load_environment(env["id"], **env.get("args", {}))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"env: {exc}") from None
        return conversation_rows(environment.get_dataset(), getattr(environment, "parser", None))
    path, split = str(data["path"]), data.get("split", "train")
    if path.endswith((".jsonl", ".json")):
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"data.path: file '{path}' does not exist")
        text = file.read_text()
        rows = ([json.loads(line) for line in text.splitlines() if line.strip()] if path.endswith(".jsonl")
                else json.loads(text))
    else:
        from datasets import load_dataset, load_from_disk

        try:
            rows = list(load_from_disk(path) if Path(path).expanduser().is_dir() else load_dataset(path, split=split))
        except Exception as exc:  # datasets raises many kinds for a missing or offline dataset
            raise ConfigError(f"data.path: cannot load dataset '{path}' ({type(exc).__name__}: {exc})") from None
    return conversation_rows(rows)


def split_args(args: dict[str, Any]) -> tuple[dict, dict]:
    """``[trainer.args]`` -> (vf-sft's own keys with defaults, ``SFTConfig`` keyword arguments).

    Raises:
        ConfigError: an unknown key (with the closest known one), a value of the wrong type, or
            ``bf16 = true`` without a GPU (``bf16`` defaults to whether a GPU is visible)."""
    import torch
    from pydantic import TypeAdapter, ValidationError

    SFTConfig = require("trl", "trl", "sft", "vf-sft").SFTConfig
    sft_fields = {f.name for f in dataclasses.fields(SFTConfig) if f.init}
    unknown = [k for k in args if k not in sft_fields and k not in OWN_KEYS]
    if unknown:
        raise ConfigError(f"unknown key 'trainer.args.{unknown[0]}'{suggest(unknown[0], [*sft_fields, *OWN_KEYS])}")
    types = {**typing.get_type_hints(SFTConfig), **OWN_TYPES}
    for key, value in args.items():
        try:
            TypeAdapter(types[key]).validate_python(value)
        except ValidationError:
            raise ConfigError(f"trainer.args.{key}: expected {types[key]}, got {value!r}") from None
    if args.get("lora_rank", 1) <= 0 or args.get("max_seq_len", 1) <= 0:
        key = "lora_rank" if args.get("lora_rank", 1) <= 0 else "max_seq_len"
        raise ConfigError(f"trainer.args.{key}: must be positive, got {args[key]}")
    own = {**OWN_KEYS, **{k: v for k, v in args.items() if k in OWN_KEYS}}
    sft = {**DEFAULTS, **{k: v for k, v in args.items() if k not in OWN_KEYS}}
    cuda = torch.cuda.is_available()
    sft.setdefault("bf16", cuda)  # bfloat16 on a GPU unless the file says otherwise
    if sft["bf16"] and not cuda:
        raise ConfigError("trainer.args.bf16 = true needs a GPU, and none is visible (training on the CPU is float32)")
    sft.setdefault("output_dir", "outputs/sft")
    sft["max_length"] = own["max_seq_len"]
    return own, sft


def train_sft(model: str, rows: list[dict], args: dict[str, Any]) -> Path:
    """Fine-tune ``model`` on ``rows`` (:func:`conversation_rows`) and save the merged model.

    Args:
        model: a hub id or a local model directory.
        rows: prompt/completion rows; the loss is on completion tokens only (TRL's
            ``completion_only_loss``).
        args: ``[trainer.args]``: ``trl.SFTConfig`` fields and vf-sft's own ``use_lora``,
            ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``,
            ``max_seq_len`` (tokens; SFTConfig's ``max_length``) and ``num_examples`` (-1: all).
    Returns:
        ``output_dir``: the model (``config.json``, safetensors weights, tokenizer) and
        ``sft_log.jsonl`` (the logged training loss per step).
    Raises:
        ConfigError: a bad key or value (one line).
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from vf_rl.config.rl_config import DEFAULT_LORA_TARGETS
    from vf_rl.trainer.model import Float32Rotary

    own, sft = split_args(args)
    if own["num_examples"] > 0:
        rows = rows[:own["num_examples"]]
    if not rows:
        raise ConfigError("no training rows")
    try:
        config = SFTConfig(**sft, completion_only_loss=True, use_cpu=not torch.cuda.is_available())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trainer.args: {exc}") from None
    out = Path(config.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if config.bf16 else torch.float32)
    lora = None
    if own["use_lora"]:
        lora = LoraConfig(r=own["lora_rank"], lora_alpha=own["lora_alpha"], lora_dropout=own["lora_dropout"],
                          target_modules=own["lora_target_modules"] or DEFAULT_LORA_TARGETS, task_type="CAUSAL_LM")
    log = out / "sft_log.jsonl"

    class LossLog(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs and "loss" in logs:
                with log.open("a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

    out.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    trainer = SFTTrainer(model=base, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=lora, callbacks=[LossLog(), Float32Rotary()])
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if lora is not None:
        trained = trained.merge_and_unload()
    staging = out / ".tmp-model"  # written aside, then moved in: a kill never leaves half a model
    shutil.rmtree(staging, ignore_errors=True)
    trained.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    for item in staging.iterdir():
        target = out / item.name
        if target.is_dir():
            shutil.rmtree(target)
        item.replace(target)
    staging.rmdir()
    return out
