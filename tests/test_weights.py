"""LoRA weights are exported merged, in checkpoint names, without touching the training model."""

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from vf_rl.trainer.weights import export_weights, merged_state_dict, merged_tensors


def tiny_llama(tied=True):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def lora(model, **kwargs):
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], **kwargs))
    with torch.no_grad():  # make the adapter non-zero, as after training
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return peft_model


def test_merged_state_dict_equals_peft_merge():
    peft_model = lora(tiny_llama())
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    exported = merged_state_dict(peft_model)
    # the training model is untouched (no merge/unmerge drift)
    assert all(torch.equal(before[k], v) for k, v in peft_model.state_dict().items())
    merged = peft_model.merge_and_unload().state_dict()
    merged.pop("lm_head.weight")  # tied: vLLM takes it from the embedding
    assert set(exported) == set(merged)
    for name, tensor in merged.items():
        assert torch.allclose(exported[name], tensor, atol=1e-6), name
    assert not torch.equal(exported["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_each_weight_is_merged_when_it_is_reached():
    """The ipc and nccl transports pack merged weights one at a time (an 8B model's whole merged
    copy did not fit beside vLLM on one H100): a merge happens when the stream reaches it, so an
    adapter changed mid-stream shows in the weights after that point only."""
    peft_model = lora(tiny_llama())
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v.clone()
            for k, v in peft_model.state_dict().items() if "lora_" not in k}
    stream = merged_tensors(peft_model)
    first = next((name, t) for name, t in stream if name.endswith("q_proj.weight"))
    assert first[0] == "model.layers.0.self_attn.q_proj.weight" and not torch.equal(first[1], base[first[0]])
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    rest = dict(stream)
    assert torch.equal(rest["model.layers.1.self_attn.q_proj.weight"], base["model.layers.1.self_attn.q_proj.weight"])
    planned = dict(merged_tensors(lora(tiny_llama()), merge=False))  # the layout, no merge computed
    assert planned.keys() == merged_state_dict(peft_model).keys() and "lm_head.weight" not in planned
    assert all(torch.equal(planned[k], base[k]) for k in planned)


def test_modules_to_save_and_untied_head_are_exported_under_base_names():
    base = tiny_llama(tied=False)
    peft_model = lora(base, modules_to_save=["lm_head"])
    with torch.no_grad():
        peft_model.base_model.model.lm_head.modules_to_save["default"].weight.add_(1.0)
    exported = merged_state_dict(peft_model)
    assert "lm_head.weight" in exported
    assert not any("original_module" in k or "modules_to_save" in k or "lora_" in k for k in exported)
    trained_head = peft_model.base_model.model.lm_head.modules_to_save["default"].weight
    assert torch.equal(exported["lm_head.weight"], trained_head)


def test_full_model_export_is_its_state_dict(tmp_path):
    model = tiny_llama(tied=False)
    path = export_weights(model, tmp_path / "weights")
    loaded = load_file(str(path))
    assert set(loaded) == set(model.state_dict())
    assert not list((tmp_path / "weights").glob(".*tmp*"))  # written atomically, no temp left
