"""Export the policy's weights for the inference server, in checkpoint format.

For a peft LoRA model the adapter is folded in *without touching the training model*:
each adapted weight is sent as ``W + delta_W`` (peft's ``get_delta_weight``), so repeated
merge/unmerge cannot drift the trained weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def merged_state_dict(model: torch.nn.Module, device: str | torch.device | None = "cpu") -> dict[str, torch.Tensor]:
    """Checkpoint-format state dict (names as ``save_pretrained`` writes them) of ``model``
    with any LoRA adapter merged. Tied output embeddings are left out.

    Args:
        device: where the returned tensors live (``None``: where the model's weights are).
    Returns:
        name -> contiguous tensor in the model's dtype.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    state = {}
    with torch.no_grad():
        deltas = {}
        if isinstance(model, PeftModel):
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer) and not module.merged:
                    delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                    if isinstance(delta, torch.Tensor):
                        deltas[f"{name}.base_layer.weight"] = delta
        for name, tensor in base.state_dict().items():
            if "lora_" in name:
                continue
            if name in deltas:
                tensor = tensor + deltas[name].to(tensor.dtype)
            clean = name.replace(".base_layer.", ".")
            if ".original_module." in clean:
                continue
            clean = clean.replace(".modules_to_save.default.", ".")
            tensor = tensor.detach()
            state[clean] = (tensor if device is None else tensor.to(device)).contiguous()
    if getattr(base.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def gathered_weights(model: torch.nn.Module):
    """A context manager in which every process holds ``model``'s full weights: under DeepSpeed
    ZeRO-3 (each process keeps only a shard of every weight) it gathers them (a collective, so
    every process enters it; one full copy of the model per process while it lasts). A no-op
    otherwise."""
    import contextlib

    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def export_weights(model: torch.nn.Module, directory: Path) -> Path:
    """Write ``model.safetensors`` into ``directory`` atomically (temp file + rename).

    Returns:
        the file's path.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.safetensors"
    tmp = directory / f".model.safetensors.tmp-{os.getpid()}"
    save_file(merged_state_dict(model), str(tmp))
    os.replace(tmp, path)
    return path
