"""The tiled MLP (vf_rl.trainer.speed.tiling, ``tiled_mlp = true``): the same loss and gradients as
the MLP run whole, fewer bytes kept for the backward pass, and the trainer applying it."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vf_rl.trainer.speed.tiling import TiledMLP, tile_count, tile_mlps

CONFIG = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1000)


def small_model(lora: bool, checkpointing: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]))
        for name, param in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: give the adapter's MLP a gradient path
                torch.nn.init.normal_(param, std=0.02)
    return model


def loss_grads_and_saved_bytes(model: torch.nn.Module, input_ids: torch.Tensor):
    """One forward/backward: the loss, every trainable parameter's gradient, and the bytes that
    autograd kept for the backward pass (saved-tensor hooks)."""
    model.train()
    model.zero_grad(set_to_none=True)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=input_ids).logits
    loss = logits.float().pow(2).mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}, saved[0]


@pytest.mark.parametrize("lora, checkpointing", [(False, False), (True, False), (True, True)])
def test_tiled_mlp_gives_the_same_gradients_and_keeps_less(lora, checkpointing):
    input_ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(1))
    whole = small_model(lora, checkpointing)
    tiled = copy.deepcopy(whole)
    assert tile_mlps(tiled) == 2 and tile_mlps(tiled) == 0  # once per layer, not twice
    loss, grads, kept = loss_grads_and_saved_bytes(whole, input_ids)
    tiled_loss, tiled_grads, tiled_kept = loss_grads_and_saved_bytes(tiled, input_ids)
    assert tiled_loss == pytest.approx(loss, rel=1e-6)
    assert grads.keys() == tiled_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(tiled_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    if not checkpointing:  # without checkpointing every layer's MLP tensors are kept: 4 x [600, 256] floats each
        assert kept - tiled_kept >= 2 * 4 * 600 * 256 * 4, (kept, tiled_kept)
    with torch.no_grad():  # evaluation: the MLP runs in tiles, the same outputs
        torch.testing.assert_close(tiled(input_ids=input_ids).logits, whole(input_ids=input_ids).logits)


def test_without_autograd_each_mlp_runs_tile_by_tile():
    """Reference log-probs (``beta > 0``) and evaluation run without autograd: each MLP still sees
    one tile at a time (a whole-sequence MLP there would hold the ``[tokens, intermediate]`` tensors
    the training pass avoids), with the outputs of the whole MLP; a short input runs whole."""
    whole = small_model(lora=True, checkpointing=False)
    tiled = copy.deepcopy(whole)
    tile_mlps(tiled)
    seen = []
    for name, module in tiled.named_modules():
        if hasattr(module, "_vf_rl_untiled_forward"):
            forward = module._vf_rl_untiled_forward
            module._vf_rl_untiled_forward = lambda x, forward=forward: seen.append(tuple(x.shape)) or forward(x)
    long_ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(tiled(input_ids=long_ids).logits, whole(input_ids=long_ids).logits)
    tiles = tile_count(2 * 300, CONFIG["hidden_size"])
    assert tiles > 1 and seen == [(2, 300 // tiles, CONFIG["hidden_size"])] * (tiles * CONFIG["num_hidden_layers"])
    seen.clear()
    with torch.no_grad():
        tiled(input_ids=long_ids[:, :16])
    assert seen == [(2, 16, CONFIG["hidden_size"])] * CONFIG["num_hidden_layers"]


def test_the_recomputation_runs_under_the_forwards_autocast():
    """Mixed precision (accelerate's bf16 autocast on a GPU; CPU autocast here): the backward
    pass recomputes each tile under the forward's autocast, in bf16 as the forward ran it (not in
    float32, autocast being off during backward), with the untiled MLP's gradients."""
    input_ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(1))
    whole = small_model(lora=True, checkpointing=False)
    tiled = copy.deepcopy(whole)
    tile_mlps(tiled)
    dtypes = []
    for name, module in tiled.named_modules():
        if name.endswith("mlp.gate_proj.base_layer"):
            module.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads, _ = loss_grads_and_saved_bytes(whole, input_ids)
        tiled_loss, tiled_grads, _ = loss_grads_and_saved_bytes(tiled, input_ids)
    assert len(dtypes) > 2 * 2 and set(dtypes) == {torch.bfloat16}, dtypes  # forward tiles and recomputed ones
    assert tiled_loss == loss
    for name, grad in grads.items():
        torch.testing.assert_close(tiled_grads[name], grad, rtol=2e-2, atol=1e-4, msg=name)


def test_tiles_and_input_gradient_of_the_function():
    assert tile_count(4096, 4096) == 1 and tile_count(131072, 4096) == 32 and tile_count(10, 4096) == 1
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8)).double()
    x = torch.randn(3, 17, 8, dtype=torch.double, requires_grad=True)
    out = TiledMLP.apply(mlp, x, 4, *mlp.parameters())
    torch.testing.assert_close(out, mlp(x))
    (grad_x,) = torch.autograd.grad(out, x, torch.ones_like(out))
    (expected,) = torch.autograd.grad(mlp(x), x, torch.ones_like(out))
    torch.testing.assert_close(grad_x, expected)


def test_the_trainer_tiles_the_mlps(model_dir, tmp_path, capsys):
    """``tiled_mlp = true`` reaches the model the trainer trains (the LoRA model's MLPs)."""
    from vf_rl.config.rl_config import RLConfig
    from vf_rl.env_api import load_environment
    from vf_rl.trainer.model import decoder_layers
    from vf_rl.trainer.trainer import RLTrainer

    args = RLConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, tiled_mlp=True,
                    use_lora=True, max_steps=1, batch_size=4, rollouts_per_example=2, micro_batch_size=2)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = RLTrainer(model=str(model_dir), env=env, args=args)
    layers = decoder_layers(trainer.model)
    assert layers and all(hasattr(layer.mlp, "_vf_rl_untiled_forward") for layer in layers)
    assert f"tiled_mlp: {len(layers)} MLPs run in tiles" in capsys.readouterr().out


@pytest.mark.slow
def test_tiled_mlp_inside_compiled_layers_gives_the_same_gradients():
    """With vf-rl's compiled decoder layers (the default on a GPU; inductor on the CPU here) the
    tiled MLP is a graph break in each layer: the same loss and gradients as the eager, whole MLP."""
    from vf_rl.trainer.model import compile_layers

    input_ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(1))
    whole = small_model(lora=True, checkpointing=False)
    compiled = copy.deepcopy(whole)
    tile_mlps(compiled)
    assert compile_layers(compiled, "inductor") == 2
    loss, grads, _ = loss_grads_and_saved_bytes(whole, input_ids)
    compiled_loss, compiled_grads, _ = loss_grads_and_saved_bytes(compiled, input_ids)
    assert compiled_loss == pytest.approx(loss, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-6, msg=name)
