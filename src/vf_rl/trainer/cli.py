"""vf-train: the trainer of a vf-rl config, standalone.

    vf-train @ config.toml [--resume]

What it does, its options and its exit statuses are its help (``USAGE``, ``DESCRIPTION``,
``EPILOG``; ``vf-train --help``).
"""

from __future__ import annotations

import sys

from vf_rl.config.cli_help import CommandParser, parse_at_command
from vf_rl.config.cpus import apply_trainer_cores
from vf_rl.config.resolved_toml import write_resolved
from vf_rl.config.schema import load_config
from vf_rl.env_api.checks import check_environments

EXIT_BAD_INPUT = 2
EXIT_ALL_FAILED = 1
EXIT_SERVER_GONE = 3
EXIT_OUT_OF_MEMORY = 4  # one sample alone does not fit (micro_step.OutOfMemoryStop)
EXIT_STALLED = 5  # the watchdog stopped a wait without progress (vf_rl.watchdog.Stalled)
EXIT_DISK_FULL = 6  # no space left while saving a checkpoint (checkpoints.DiskFull)
EXIT_HEALTH_STOP = 7  # a rule named in health_stop raised its alarm (trainer/health.py)
EXIT_INTERRUPTED = 130  # as bash reports a command ended by Ctrl-C


USAGE = """vf-train @ config.toml [--resume]
       vf-train -h | --help | --version"""

DESCRIPTION = """\
Train on a vf-rl config alone: the trainer that vf-rl starts in its "Trainer" pane, for a server
started by hand or on another machine.

vf-train loads the config (a resolved.toml that vf-rl wrote is used as it is; any other file is
checked and resolved first, and written to <output_dir>/resolved.toml), loads the environments
of [env], builds RLConfig from [trainer.args] and trains the model with RLTrainer. The vf-vllm
server at vllm_server_host:vllm_server_port must already be serving the config's model (start
one with vf-vllm @ config.toml). VF_RL_CPU_CORES (for example 1 or 2-3) pins the trainer to those
CPU cores before torch starts; vf-rl sets it when the server and the trainer share the CPU."""

EPILOG = """\
exit status: 0 done; 1 nothing to train on (every rollout of a batch failed, or preflight =
"strict" judged the first batch unable to teach; one line); 2 bad input (one line naming the file
and the key); 3 the inference server exited or never came up (one line with its last error);
4 out of memory on one sample alone (one line: its length and the keys to change; the last
complete step's checkpoint is saved; micro batches that run out of memory are split and the run
goes on); 5 a wait made no progress for stall_timeout seconds (the watchdog's line: who waited on
whom for what, the other side's state; the last complete step's checkpoint is saved); 6 no space
left on device while saving a checkpoint (the previous complete checkpoint stays the resume point);
7 a health rule named in health_stop raised its alarm (its line; that step's checkpoint is saved);
130 Ctrl-C (the last complete checkpoint is kept). After 4, 5, 6 and 7, --resume goes on from the
last complete checkpoint (docs/faults.md)."""


def build_parser() -> CommandParser:
    """The parser of ``vf-train @ config.toml [options]``; its help is ``vf-train --help``."""
    parser = CommandParser("vf-train", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--resume", action="store_true",
                        help="Resume from the last complete checkpoint in output_dir: weights, optimizer, "
                             "learning-rate schedule, step count and dataset position.")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # also while loading: exit with a status, not by the signal
        print("vf-train: interrupted (Ctrl-C); the last complete checkpoint is kept", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config_path, opts = parse_at_command(build_parser(), argv)
        # VF_RL_CPU_CORES (set by vf-rl when both sides share the CPU), before anything imports torch:
        # checking a TrainingArguments key may import transformers (where its source cannot be read), and a torch thread pool
        # sized for every core but pinned to fewer makes each training step many times slower
        apply_trainer_cores()
        config = load_config(config_path)
        check_environments(config, config_path)
        if config.origins:  # resolved here (not vf-rl's resolved.toml): the run's record of what it uses
            write_resolved(config)
    except (ValueError, OSError) as exc:  # ConfigError, a bad VF_RL_CPU_CORES, an unwritable output_dir
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from vf_rl.config.rl_config import RLConfig
    from vf_rl.env_api.registry import load_environments
    from vf_rl.trainer.trainer import RLTrainer

    try:
        args = RLConfig(**config.trainer.args)
        if opts.resume:
            args.resume_from_checkpoint = True
        env = load_environments(config.envs, args.seed)
    except (TypeError, ValueError) as exc:
        print(f"vf-train: error: {config_path}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from vf_rl.env_api.errors import AllRolloutsFailed
    from vf_rl.inference.supervision import ServerExited
    from vf_rl.trainer.checkpoints import DiskFull
    from vf_rl.watchdog import Stalled

    print(f"Loading model {config.model} (config: {config_path})...", flush=True)
    share = config.inference.shared and float(config.inference.args.get("gpu_memory_utilization", 0.9))
    trainer = RLTrainer(model=config.model, env=env, args=args, server_shares_gpu=share)
    from vf_rl.orchestrator.preflight import PreflightRefused
    from vf_rl.trainer.micro_step import OutOfMemoryStop

    try:
        trainer.train()
    except PreflightRefused as exc:  # preflight = "strict": the first batch says the run cannot learn
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_ALL_FAILED
    except ValueError as exc:  # e.g. resume with no checkpoint
        if "resume_from_checkpoint" not in str(exc):
            raise
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AllRolloutsFailed as exc:  # nothing to train on: the cause in one line (the log has each error)
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_ALL_FAILED
    except (ServerExited, TimeoutError) as exc:  # the server is gone or never came up: say so, no traceback
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_SERVER_GONE
    except OutOfMemoryStop as exc:  # one sample alone does not fit: its length and the keys to change
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except Stalled as exc:  # its line names the wait, the other side's state and the checkpoint
        print(exc, file=sys.stderr, flush=True)
        return EXIT_STALLED
    except DiskFull as exc:  # the previous complete checkpoint stays the resume point
        print(exc, file=sys.stderr, flush=True)
        return EXIT_DISK_FULL
    except PermissionError as exc:  # the server refused our weight-update secret
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from vf_rl.trainer.health import stop_reason

    reason = stop_reason(trainer)
    if reason is not None:  # the alarm's line, the checkpoint of its step saved
        print(f"vf-train: error: health_stop: {reason}", file=sys.stderr)
        return EXIT_HEALTH_STOP
    return 0


if __name__ == "__main__":
    sys.exit(main())
