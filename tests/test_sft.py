"""vf-sft: supervised warm-up on the real SmolLM2 (CPU) through the command line; the rows of
every shape it accepts; its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from vf_rl.config.rules import ConfigError
from vf_rl.env_api import BoxedParser, XMLParser
from vf_rl.environments.reverse_text import load_environment as reverse_text
from vf_rl.sft.train import conversation_rows, split_args


def sft(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vf_rl.sft.cli", *args], capture_output=True, text=True, cwd=cwd)


def completion_logprob(model_dir, prompt, completion) -> float:
    """Summed log-prob of ``completion`` (an assistant message) after the chat ``prompt``."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": completion}], tokenize=True,
                                   return_dict=False)
    assert full[:len(head)] == head
    ids = torch.tensor([full])
    with torch.no_grad():
        logprobs = model(ids).logits[0, :-1].log_softmax(-1)
    return float(logprobs[torch.arange(len(head) - 1, len(full) - 1), ids[0, len(head):]].sum())


@pytest.mark.slow
def test_reverse_text_warm_up_learns_the_held_out_task(model_dir, tmp_path):
    """SFT on reverse-text's shipped training rows raises the log-prob of the correct, formatted
    reversal of held-out texts (the eval split) well above the base model's."""
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    config.write_text(f'model = "{model_dir}"\n[env]\nid = "reverse-text"\nargs = {{ few_shot = 0, source = "offline" }}\n'
                      f'[trainer.args]\noutput_dir = "{out}"\nnum_examples = 96\nper_device_train_batch_size = 16\n'
                      'learning_rate = 2e-3\nlora_rank = 16\nlora_alpha = 32\nmax_seq_len = 256\nnum_train_epochs = 2\n')
    result = sft("@", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors")) and (out / "tokenizer_config.json").is_file()
    # a plain model directory: no adapter left to merge
    assert not (out / "adapter_config.json").exists()
    losses = [json.loads(line)["loss"] for line in (out / "sft_log.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and losses[-1] < 0.5 * losses[0]
    env = reverse_text(few_shot=0, source="offline")
    held_out = env.get_eval_dataset(4)
    gains = [completion_logprob(out, row["prompt"], f"<reversed_text>{row['answer']}</reversed_text>")
             - completion_logprob(model_dir, row["prompt"], f"<reversed_text>{row['answer']}</reversed_text>")
             for row in held_out]
    assert min(gains) > 5.0, gains


def test_rows_of_every_shape():
    parser = XMLParser(["reversed_text"])
    rows = conversation_rows([
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                      {"role": "assistant", "content": "a"}, {"role": "user", "content": "thanks"}]},
        {"prompt": "q", "completion": "a"},
        {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]},
        {"prompt": [{"role": "user", "content": "abc"}], "answer": "cba"},
    ], parser)
    assert rows[0] == {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                       "completion": [{"role": "assistant", "content": "a"}]}
    assert rows[1] == rows[2] == {"prompt": [{"role": "user", "content": "q"}],
                                  "completion": [{"role": "assistant", "content": "a"}]}
    assert rows[3]["completion"] == [{"role": "assistant", "content": "<reversed_text>cba</reversed_text>"}]
    # what the parser writes, it reads back
    assert parser.parse_answer(rows[3]["completion"]) == "cba"
    assert BoxedParser().parse_answer([{"role": "assistant", "content": BoxedParser().format_answer("72")}]) == "72"
    with pytest.raises(ConfigError, match="row 0: expected 'messages'"):
        conversation_rows([{"question": "q"}])
    with pytest.raises(ConfigError, match="no assistant message"):
        conversation_rows([{"messages": [{"role": "user", "content": "q"}]}])


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.args.learning_rat' \(did you mean 'learning_rate'"):
        split_args({"learning_rat": 1e-4})
    own, sft_args = split_args({"max_seq_len": 128, "learning_rate": 1e-3})
    assert sft_args["max_length"] == 128 and sft_args["learning_rate"] == 1e-3 and own["use_lora"] is True


@pytest.mark.parametrize("text, expected", [
    ('model = "{model}"\n[trainer.args]\n', "give either [data]"),
    ('model = "{model}"\n[data]\npath = "missing.jsonl"\n', "data.path: file 'missing.jsonl' does not exist"),
    ('model = "{model}"\n[env]\nid = "reverse-text"\n[trainer.args]\nlearning_rat = 1\n',
     "unknown key 'trainer.args.learning_rat'"),
    ('model = "/nonexistent/model"\n[env]\nid = "reverse-text"\n', "model: local model directory"),
    ('model = "{model}"\n[env]\nid = "reverse-text"\nargz = 1\n', "env.argz: unknown key"),
    ('model = "{model}"\n[env]\nid = "reverse-text"\n[trainer.args]\nnum_train_epochs = "x"\n', "trainer.args"),
    ('model = "{model}"\n[env]\nid = "reverse-text"\n[trainer.args]\nbf16 = true\n', "bf16 = true needs a GPU"),
])
def test_bad_input_is_one_line_and_exit_2(model_dir, tmp_path, text, expected):
    config = tmp_path / "bad.toml"
    config.write_text(text.format(model=model_dir))
    result = sft("@", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "outputs").exists()  # nothing half-written


def test_jsonl_rows_train(model_dir, tmp_path):
    """A [data] file of message rows trains (2 steps) and writes a loadable model."""
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"say {i}"},
                                                       {"role": "assistant", "content": str(i)}]}) for i in range(8)))
    config = tmp_path / "sft.toml"
    config.write_text(f'model = "{model_dir}"\n[data]\npath = "{data}"\n[trainer.args]\noutput_dir = "{tmp_path / "o"}"\n'
                      "max_steps = 2\nper_device_train_batch_size = 4\nuse_lora = false\nlearning_rate = 1e-5\nbf16 = false\n")
    result = sft("@", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    AutoModelForCausalLM.from_pretrained(tmp_path / "o")
