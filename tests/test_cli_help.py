"""Every command's help without a config: ``--help``/``-h`` (exit 0) in full sentences naming
every option, ``--version`` (exit 0), no arguments (the help on stderr, exit 2), usage errors in
one line, and the subcommands of ``vf-rl`` dispatched to their own parsers. Each runs as a
subprocess, as a user runs it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "vf-rl" / "reverse-text-cpu.toml"

# (module run with python -m, its arguments before --help) -> (the command as typed, options its help must name)
COMMANDS = {
    "vf-rl": ("vf_rl.launcher.main", [], ["-s, --session", "--dry-run", "--preflight", "--preflight-prompts",
                                          "--base-url", "--json", "--resume", "--wait", "--print-commands",
                                          "--node-rank", "--version", "-h, --help"]),
    "vf-train": ("vf_rl.trainer.cli", [], ["--resume", "--version"]),
    "vf-vllm": ("vf_rl.inference.server", [], ["--model", "--port", "--host", "--version"]),
    "vf-sft": ("vf_rl.sft.cli", [], ["--version"]),
    "vf-rl plot": ("vf_rl.launcher.main", ["plot"], ["RUN_DIR", "-o, --out", "--version"]),
    "vf-rl prepare-model": ("vf_rl.launcher.main", ["prepare-model"], ["--out", "--version"]),
    "vf-rl eval": ("vf_rl.launcher.main", ["eval"], ["ENV_ID", "-m, --model", "-n, --num-examples",
                                                     "-r, --rollouts-per-example", "-a, --env-args", "-t, --max-tokens",
                                                     "-T, --temperature", "--split", "--base-url", "--serve",
                                                     "--vllm-args", "--max-concurrent", "-o, --output"]),
}
SUBCOMMANDS = ["plot", "export", "view", "prepare-model", "eval", "install-verifiers-classic"]
# subcommands whose modules other work adds: dispatched when present, one line and exit 2 when not
LATER = {"export": "vf_rl.trainer.export", "install-verifiers-classic": "vf_rl.launcher.install_verifiers"}


def run(module: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def option_helps(help_text: str) -> dict[str, str]:
    """Each entry of the help's option and argument lists -> its help text, joined across lines."""
    entries, current = {}, None
    for line in help_text.splitlines():
        if m := re.match(r"^  (\S.*?)(?:  +(\S.*))?$", line):
            current = m.group(1)
            entries[current] = m.group(2) or ""
        elif current and re.match(r"^ {4,}\S", line):
            entries[current] = (entries[current] + " " + line.strip()).strip()
        else:
            current = None
    return entries


def description(help_text: str) -> str:
    """The help's first paragraph after the usage lines."""
    return help_text.split("\n\n")[1]


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_names_every_option_in_sentences(command, flag, tmp_path):
    module, before, options = COMMANDS[command]
    result = run(module, *before, flag, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {command} "), result.stdout[:200]
    assert result.stderr == ""
    entries = option_helps(result.stdout)
    for option in options:
        assert any(entry.startswith(option) for entry in entries), (option, list(entries))
    for entry, text in entries.items():
        if entry.startswith("-") or entry.isupper():  # an option or a positional argument
            assert text.endswith("."), (entry, text)
    assert description(result.stdout).rstrip().endswith("."), description(result.stdout)
    assert list(tmp_path.iterdir()) == []  # help writes nothing


def test_vf_rl_help_lists_the_subcommands():
    result = run("vf_rl.launcher.main", "--help")
    commands = option_helps(result.stdout.split("commands (")[1])
    assert list(commands) == SUBCOMMANDS
    assert all(text.endswith(".") for text in commands.values()), commands
    assert "vf-vllm" in result.stdout and "vf-train" in result.stdout


def test_help_after_a_config_is_the_whole_help():
    """``vf-rl @ config.toml --help`` shows the options in full: the description ends with a full stop."""
    result = run("vf_rl.launcher.main", "@", str(CONFIG), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout == run("vf_rl.launcher.main", "--help").stdout
    assert description(result.stdout).rstrip().endswith(".")
    trained = run("vf_rl.trainer.cli", "@", str(CONFIG), "-h")
    assert trained.returncode == 0 and "--resume" in trained.stdout


@pytest.mark.parametrize("command", list(COMMANDS))
def test_version(command):
    module, before, _ = COMMANDS[command]
    result = run(module, *before, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"vf-rl {importlib.metadata.version('vf-rl')}\n"


@pytest.mark.parametrize("command", ["vf-rl", "vf-train", "vf-vllm", "vf-sft"])
def test_no_arguments_print_the_help_as_a_usage_error(command):
    """No arguments at all: the help on stderr, exit status 2 (a config is required), nothing started."""
    module, _, options = COMMANDS[command]
    result = run(module)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"usage: {command} ")
    assert all(option in result.stderr for option in options)


def test_plot_help_looks_for_no_file(tmp_path):
    result = run("vf_rl.launcher.main", "plot", "--help", cwd=tmp_path)
    assert result.returncode == 0 and "not found" not in result.stdout + result.stderr
    assert "metrics.jsonl" in result.stdout  # it says what it reads


@pytest.mark.parametrize("subcommand", list(LATER))
def test_subcommands_others_add_are_dispatched(subcommand):
    result = run("vf_rl.launcher.main", subcommand, "--help")
    if importlib.util.find_spec(LATER[subcommand]) is not None:
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: vf-rl {subcommand}")
    else:
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"vf-rl {subcommand}: error: this install of vf-rl has no {subcommand} command "
            f"(module {LATER[subcommand]} is missing)"]


def test_a_missing_subcommand_module_is_one_line():
    code = ("import sys\nfrom vf_rl.launcher import main as m\n"
            "m.COMMANDS['later'] = ('vf_rl.launcher.no_such_module', 'A command still to come.')\n"
            "sys.exit(m.main(['later', '--help']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "vf-rl later: error: this install of vf-rl has no later command (module vf_rl.launcher.no_such_module is missing)"]


@pytest.mark.parametrize("args, needles", [
    (["config.toml"], ["first argument must be '@'", "did you mean vf-rl @ config.toml?"]),
    (["evl"], ["first argument must be '@'", "did you mean vf-rl eval?"]),
    (["--dry-run"], ["first argument must be '@'", *SUBCOMMANDS]),
    (["@", str(CONFIG), "--bogus"], ["vf-rl: error: unrecognized arguments: --bogus (vf-rl --help lists the options)"]),
    (["@", str(CONFIG), "--node-rank", "one"], ["vf-rl: error: argument --node-rank: invalid int value: 'one'"]),
    (["plot"], ["vf-rl plot: error: the following arguments are required: RUN_DIR"]),
    (["eval", "reverse-text"], ["vf-rl eval: error: the following arguments are required: -m/--model"]),
])
def test_usage_errors_are_one_line(args, needles, tmp_path):
    result = run("vf_rl.launcher.main", *args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module, name", [("vf_rl.trainer.cli", "vf-train"), ("vf_rl.sft.cli", "vf-sft")])
def test_usage_errors_of_the_other_commands_are_one_line(module, name):
    result = run(module, "@", str(CONFIG), "--bogus")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"{name}: error: unrecognized arguments: --bogus ({name} --help lists the options)"]


def test_help_imports_neither_torch_nor_vllm():
    """``--help`` of every command answers at once: nothing heavy is imported to print it."""
    code = """
import contextlib, importlib, io, sys
for module, argv in [("vf_rl.launcher.main", ["--help"]), ("vf_rl.trainer.cli", ["--help"]),
                     ("vf_rl.inference.server", ["--help"]), ("vf_rl.sft.cli", ["--help"]),
                     ("vf_rl.launcher.main", ["plot", "--help"]), ("vf_rl.launcher.main", ["eval", "--help"]),
                     ("vf_rl.launcher.main", ["prepare-model", "--help"])]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        importlib.import_module(module).main(argv)
print(sorted(m for m in ("torch", "vllm", "transformers", "trl", "matplotlib") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_eval_without_a_server_points_to_serve(tmp_path):
    """``vf-rl eval`` against a port nothing listens on: exit 1, and the one error line says to use --serve."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run("vf_rl.launcher.main", "eval", "reverse-text", "-m", "some-model", "-n", "1", "-r", "1",
                 "--base-url", f"http://127.0.0.1:{port}/v1", "-o", str(tmp_path / "eval.jsonl"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("vf-rl eval: error:")]
    assert len(error) == 1 and f"no server answers at http://127.0.0.1:{port}/v1 (--serve starts" in error[0], error
