"""``vf-rl``, the command: one TOML file -> a tmux session with an "Inference" pane (vf-vllm) and a
"Trainer" pane (vf-train).

    vf-rl @ config.toml [-s SESSION] [--dry-run] [--wait]
    vf-rl @ config.toml --resume          (continue from the last checkpoint)
    vf-rl @ config.toml --preflight       (can the run learn? a report before the run: vf_rl.launcher.preflight)
    vf-rl prepare-model [--out DIR]
    vf-rl plot RUN_DIR

The launch itself is ``launch.py``; the pre-flight ``preflight.py``. This module imports neither
torch nor vLLM, so configuration errors are reported at once.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path

from vf_rl.config.schema import ConfigError, load_config, parse_at_args
from vf_rl.config.vllm_flags import check_inference_args
from vf_rl.env_api.checks import check_environments, check_tool_calling
from vf_rl.launcher.launch import EXIT_BAD_INPUT, dry_run, launch, print_commands, run_node


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if hasattr(signal, "SIGPIPE") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `vf-rl ... --dry-run | head` ends quietly
    if argv[:1] == ["prepare-model"]:
        from vf_rl.launcher.prepare_model import main as prepare_main

        return prepare_main(argv[1:])
    if argv[:1] == ["plot"]:
        from vf_rl.trainer.plot import main as plot_main

        return plot_main(argv[1:])
    try:
        config_path, rest = parse_at_args(argv, "vf-rl")
        parser = argparse.ArgumentParser(prog="vf-rl @ config.toml", description=__doc__.splitlines()[0].replace('``', ''))
        parser.add_argument("-s", "--session", default="vf-rl", help="tmux session name (default: vf-rl)")
        parser.add_argument("--dry-run", action="store_true", help="validate and print the pane commands; start nothing")
        parser.add_argument("--resume", action="store_true",
                            help="resume the trainer from the last checkpoint in output_dir")
        parser.add_argument("--wait", action="store_true",
                            help="block until the trainer ends; exit with its status (for scripts and CI)")
        parser.add_argument("--print-commands", action="store_true",
                            help="print the inference server's command and every trainer node's; start nothing")
        parser.add_argument("--node-rank", type=int, default=None,
                            help="run only trainer node K here, in the foreground, without tmux or a server (for "
                                 "SLURM/ssh; `vf-rl @ cfg` alone runs node 0 next to its server in tmux)")
        parser.add_argument("--preflight", action="store_true", help="report whether the run can learn (baseline reward, "
                            "reward spread, truncation, lengths, failures) and exit; vf_rl.launcher.preflight")
        parser.add_argument("--preflight-prompts", type=int, default=None, help="--preflight: training prompts (default 16)")
        parser.add_argument("--base-url", default=None, help="--preflight: a running server's OpenAI root instead of one started")
        parser.add_argument("--json", type=Path, default=None, help="--preflight: also write the report to this JSON file")
        opts = parser.parse_args(rest)
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
