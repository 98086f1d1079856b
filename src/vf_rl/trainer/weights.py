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


def merged_tensors(model: torch.nn.Module, device: str | torch.device | None = None, merge: bool = True):
    """Yield ``(name, tensor)`` in checkpoint format (names as ``save_pretrained`` writes them) for
    ``model``, any LoRA adapter merged, tied output embeddings left out. An adapted weight's
    ``W + delta_W`` is computed when it is reached, so at most one merged weight and its delta
    are live beside the model (a whole merged copy of an 8B model is 15 GiB more than a GPU
    shared with vLLM has).

    Args:
        device: where the yielded tensors live (``None``: where the model's weights are).
        merge: ``False`` yields the unmerged base weights (same names, shapes and dtypes), for
            planning buffers without computing any merge.
    Yields:
        name, contiguous tensor in the model's dtype.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    adapted = {}
    if merge and isinstance(model, PeftModel):
        adapted = {f"{name}.base_layer.weight": module for name, module in base.named_modules()
                   if isinstance(module, LoraLayer) and not module.merged}
    tied = getattr(base.config, "tie_word_embeddings", False)
    with torch.no_grad():
        for name, tensor in base.state_dict().items():
            clean = name.replace(".base_layer.", ".")
            if "lora_" in name or ".original_module." in clean:
                continue
            clean = clean.replace(".modules_to_save.default.", ".")
            if tied and clean == "lm_head.weight":
                continue
            module = adapted.get(name)
            if module is not None:
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                if isinstance(delta, torch.Tensor):
                    tensor = tensor + delta.to(tensor.dtype)
            tensor = tensor.detach()
            yield clean, (tensor if device is None else tensor.to(device)).contiguous()


def merged_state_dict(model: torch.nn.Module, device: str | torch.device | None = "cpu") -> dict[str, torch.Tensor]:
    """:func:`merged_tensors` as a dict (every merged tensor held at once: on the GPU, a second
    copy of the adapted weights).

    Args:
        device: where the returned tensors live (``None``: where the model's weights are).
    Returns:
        name -> contiguous tensor in the model's dtype.
    """
    return dict(merged_tensors(model, device))


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
