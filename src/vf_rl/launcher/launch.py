"""vf-rl's launch: one resolved config -> a tmux session with an "Inference" pane (vf-vllm) and a
"Trainer" pane (vf-train); the pane commands, the GPU and CPU split, ``--dry-run``, ``--wait``.

GPUs are assigned contiguously: inference gets the first ``inference.gpus`` visible devices,
the trainer the next ``trainer.gpus``; ``gpus = 0`` runs that side on the CPU. With both sides on
the CPU, the cores are split the same way (``vf_rl.config.cpus``). Each pane's
output is also written to ``<output_dir>/logs/{inference,trainer}.log``. When the trainer
ends, its exit status goes to ``<output_dir>/logs/trainer.exit`` and the inference server is
stopped. ``--wait`` (for scripts) blocks until then and exits with the trainer's status.

This module imports neither torch nor vLLM, so configuration errors are reported at once.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vf_rl.config.cpus import cpu_side_env
from vf_rl.config.gpus import visible_gpus
from vf_rl.config.layout import LOOPBACK, trainer_values
from vf_rl.config.resolved_toml import to_toml, write_resolved
from vf_rl.config.schema import ConfigError, VfRlConfig
from vf_rl.inference.server import server_argv
from vf_rl.inference.supervision import LOG_FILTER, SIGINT_STATUS, exited_message, supervised_shell
from vf_rl.launcher.ports import check_port_free

EXIT_BAD_INPUT = 2


@dataclass
class PaneCommand:
    """A pane's title, environment additions and argv."""

    title: str
    env: dict[str, str]
    argv: list[str]

    def line(self) -> str:
        """``env K=V ... argv`` as one bash command."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"env {env} {shlex.join(self.argv)}"

    def shell(self, log: Path, exit_file: Path | None = None, after: str = "") -> str:
        """The bash line the pane runs: env, the command teed to ``log``, exit status saved. In
        a subshell that survives Ctrl-C (``trap : INT``; ``tee -i``), so that the status is
        written and ``after`` runs when the command is interrupted too (a bash whose command
        died of SIGINT drops the rest of its line)."""
        # the log keeps each line's last state (LOG_FILTER); its writer ignores Ctrl-C as tee -i
        # does, and is waited for before the status is written
        line = (f"{self.line()} 2>&1 | tee -i >(trap '' INT; exec sed -u {shlex.quote(LOG_FILTER)} > "
                f"{shlex.quote(str(log))}); code=${{PIPESTATUS[0]}}; wait $!")
        if exit_file is not None:
            line += f"; echo $code > {shlex.quote(str(exit_file))}"
        return f"( trap : INT; {line}" + (f"; {after}" if after else "") + "; echo \"[exited with status $code]\" )"


def pane_process(line: str) -> str:
    """The command a tmux pane runs as its own process: bash running ``line`` (a bash line: it reads
    ``PIPESTATUS``), then an interactive bash, so that the pane keeps its output and gives a prompt
    once ``line`` has ended. Nothing is typed into the pane, so the line is not echoed there."""
    return "bash -c " + shlex.quote(line + "; exec bash")


FORWARDED_ENV_PREFIXES = ("PATH", "VIRTUAL_ENV", "PYTHONPATH", "HF_", "HUGGING_FACE", "TRANSFORMERS_", "VLLM_",
                          "VF_RL_", "WANDB_", "NCCL_", "TORCH_", "NVSHMEM_", "CUDA_HOME", "LD_LIBRARY_PATH", "TRITON_",
                          "OMP_", "TMPDIR", "HOME")


def entry_point(name: str, module: str) -> list[str]:
    """argv that runs console script ``name``: the script beside this Python if installed
    there (a venv's bin/), else ``python -m module``."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", module]


def build_commands(config: VfRlConfig, config_path: Path, gpus: list[str],
                   node_rank: int = 0) -> tuple[PaneCommand, PaneCommand]:
    """The two pane commands for the resolved ``config`` (the trainer's for node ``node_rank``):
    ``vf-vllm @ config_path`` and ``vf-train @ config_path`` with their GPUs.

    Args:
        config_path: the file both read (``vf-rl`` passes the ``resolved.toml`` it wrote).
        gpus: the visible GPU ids to hand out (contiguously, inference first). With no GPU on
            either side, the CPU cores are split instead: the server's first half, the trainer's
            the rest (``vf_rl.config.cpus.cpu_side_env``).
    """
    n_inf, n_train = config.inference.gpus, config.trainer.gpus
    first_train = 0 if config.inference.shared or node_rank > 0 else n_inf  # nodes >= 1 have no server
    inf_gpus, train_gpus = gpus[:n_inf], gpus[first_train:first_train + n_train]
    host, _ = config.server_address()
    lora_env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if config.inference.args.get("enable_lora") else {}
    secret_env = {}
    if host not in LOOPBACK:  # reachable beyond this machine: weight updates need the shared secret
        secret_env["VF_RL_WEIGHT_SECRET"] = os.environ.get("VF_RL_WEIGHT_SECRET") or secrets.token_hex(16)
    server_cpus, trainer_cpus = {}, {}
    if n_inf == 0 and n_train == 0 and node_rank == 0:  # both on this machine's CPU: split its cores as GPUs are
        server_cpus, trainer_cpus = cpu_side_env()
    if n_train == 0 and "DS_ACCELERATOR" not in os.environ:  # DeepSpeed, when installed, says so at import
        trainer_cpus["DS_ACCELERATOR"] = "cpu"
    inference = PaneCommand("Inference", {"CUDA_VISIBLE_DEVICES": ",".join(inf_gpus), "PYTHONUNBUFFERED": "1",
                                          **lora_env, **secret_env, **server_cpus},
                            [*entry_point("vf-vllm", "vf_rl.inference.server"), "@", str(config_path)])
    trainer = PaneCommand("Trainer", {"CUDA_VISIBLE_DEVICES": ",".join(train_gpus), "PYTHONUNBUFFERED": "1",
                                      **secret_env, **trainer_cpus},
                          trainer_argv(config, config_path, node_rank))
    return inference, trainer


def trainer_argv(config: VfRlConfig, config_path: Path, node_rank: int = 0) -> list[str]:
    """The trainer's argv on node ``node_rank``: ``vf-train @ cfg`` for one process,
    ``accelerate launch`` for several (with ``--num_machines``/``--machine_rank`` and node 0's
    ``main_address`` when ``trainer.nodes > 1``)."""
    train = ["-m", "vf_rl.trainer.cli", "@", str(config_path)]
    if config.trainer.processes == 1:
        return [*entry_point("vf-train", "vf_rl.trainer.cli"), "@", str(config_path)]
    accelerate = entry_point("accelerate", "accelerate.commands.launch")
    if len(accelerate) == 1:
        accelerate.append("launch")
    argv = [*accelerate, "--num_processes", str(config.trainer.processes)]
    if config.trainer.nodes > 1:
        host, port = config.trainer.main_address.rsplit(":", 1)
        argv += ["--num_machines", str(config.trainer.nodes), "--machine_rank", str(node_rank),
                 "--main_process_ip", host, "--main_process_port", port]
        if config.trainer.gpus == 0:
            argv.append("--cpu")
    return [*argv, *train]


def gpus_needed(config: VfRlConfig) -> int:
    """GPUs a config uses: inference + trainer, or the larger of the two when shared."""
    if config.inference.shared:
        return max(config.inference.gpus, config.trainer.gpus)
    return config.inference.gpus + config.trainer.gpus


def check_gpus(config: VfRlConfig, gpus: list[str] | None, dry_run: bool, config_path: Path | None = None) -> list[str]:
    """The GPU ids to hand out.

    Raises:
        ConfigError: fewer GPUs are visible than the config asks for (not on a dry run, which warns:
            it checks a GPU config on any machine, and says when it could not count the GPUs).
    """
    needed = gpus_needed(config)
    known = gpus is not None
    gpus = gpus or []
    if needed > len(gpus):
        what = "max(inference.gpus, trainer.gpus) (shared)" if config.inference.shared else "inference.gpus + trainer.gpus"
        message = (f"{config_path or 'config'}: {what} = {needed} GPUs, but {len(gpus)} are "
                   f"visible (CUDA_VISIBLE_DEVICES / nvidia-smi); use gpus = 0 to run a side on the CPU")
        if not dry_run:
            raise ConfigError(message)
        # a dry run checks a GPU config on any machine (a laptop, a login node): it says what a launch here refuses
        print(f"warning: {message} (a launch here refuses this; the dry run goes on)" if known else
              f"warning: {config_path or 'config'}: {needed} GPUs asked for; no nvidia-smi here, so the dry run could "
              "not check them (a launch does)", file=sys.stderr)
        gpus = gpus + [str(i) for i in range(len(gpus), needed)]
    return gpus


def memory_line(config: VfRlConfig, gpus: list[str] | None, config_path: Path,
                refuse: bool) -> tuple[bool, str] | None:
    """``(fits, line)``: the trainer's memory estimate against its GPU (``vf_rl.config.memory.launch_check``),
    or ``None`` for a CPU trainer.

    Raises:
        ConfigError: ``refuse`` and the estimate does not fit (``preflight = "strict"`` at launch)."""
    from vf_rl.config.gpus import trainer_gpu_of
    from vf_rl.config.memory import launch_check

    checked = launch_check(config, trainer_gpu_of(config, gpus))
    if checked is None:
        return None
    fits, line = checked
    if refuse and not fits:
        raise ConfigError(f"{config_path}: {line} (preflight = \"strict\")")
    return checked


def launch(config: VfRlConfig, config_path: Path, session_name: str, wait: bool, resume: bool = False) -> int:
    """Open the tmux session and return 0 (or the trainer's status with ``wait``)."""
    import libtmux
    import psutil

    visible = visible_gpus()
    memory = memory_line(config, visible, config_path, refuse=trainer_values(config)["preflight"] == "strict")
    if memory is not None and not memory[0]:
        print(f"vf-rl: warning: {memory[1]}", file=sys.stderr)
    gpus = check_gpus(config, visible, dry_run=False, config_path=config_path)
    host, port = config.server_address()
    check_port_free("0.0.0.0" if host not in LOOPBACK else "127.0.0.1", port)
    try:
        resolved_path = write_resolved(config)
    except OSError as exc:
        raise ConfigError(f"{config_path}: trainer.args.output_dir: cannot write {config.output_dir} ({exc})") from None
    inference, trainer = build_commands(config, resolved_path.resolve(), gpus)
    if resume:
        trainer.argv.append("--resume")
    logs = (config.output_dir / "logs").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    exit_file = logs / "trainer.exit"
    exit_file.unlink(missing_ok=True)
    (logs / "inference.log").unlink(missing_ok=True)  # the supervisor appends across restarts
    trainer.env.update(VF_RL_INFERENCE_EXIT_FILE=str(logs / "inference.exit"),
                       VF_RL_INFERENCE_LOG=str(logs / "inference.log"))
    server = libtmux.Server()
    if server.has_session(session_name):
        server.kill_session(session_name)
    environment = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    serving = supervised_shell(inference.line(), logs / "inference.log", logs / "inference.exit",
                               logs / "inference.restarts", exit_file)
    session = server.new_session(session_name, window_name="vf-rl", attach=False, x=220, y=60,
                                 start_directory=str(Path.cwd()), environment=environment,
                                 window_command=pane_process(serving))
    window = session.active_window
    top = window.active_pane
    resume_hint = resume_command(config_path, session_name)
    checkpoints = shlex.quote(str(config.output_dir.resolve())) + "/checkpoint-*"
    after = (f"tmux send-keys -t {top.pane_id} C-c; if [ $code -ne 0 ] && [ $code -ne {SIGINT_STATUS} ]; then "
             f"if ls -d {checkpoints} >/dev/null 2>&1; then "
             f"echo {shlex.quote('[vf-rl] the trainer failed; the last complete checkpoint resumes with: ' + resume_hint)}"
             f"; else echo {shlex.quote('[vf-rl] the trainer failed before its first checkpoint')}; fi; fi")
    bottom = top.split(direction=libtmux.constants.PaneDirection.Below, start_directory=str(Path.cwd()),
                       environment=environment,
                       shell=pane_process(trainer.shell(logs / "trainer.log", exit_file, after=after)))
    window.set_option("pane-border-status", "top")
    for pane, cmd in ((top, inference), (bottom, trainer)):
        pane.cmd("select-pane", "-T", cmd.title)
    checks_s = time.time() - psutil.Process().create_time()  # what the config's checks add to a run's start
    print(f"vf-rl: tmux session '{session_name}' started {checks_s:.1f} s after vf-rl did (logs in {logs})")
    interactive = sys.stdout.isatty() and not os.environ.get("TMUX")
    if not wait:
        if interactive:
            session.attach()
        else:
            print(f"vf-rl: watch with: tmux attach -t {session_name}")
        return 0
    if not interactive:
        return wait_for_trainer(server, session_name, logs, resume_hint)
    # attached, while a watcher closes the session once the trainer has finished
    result: list[int] = []
    watcher = threading.Thread(target=lambda: result.append(wait_for_trainer(server, session_name, logs, resume_hint,
                                                                             linger=5.0)), daemon=True)
    watcher.start()
    session.attach()
    if watcher.is_alive():
        print(f"vf-rl: detached; waiting for the trainer (re-attach: tmux attach -t {session_name})")
    watcher.join()
    return result[0] if result else 1


def resume_command(config_path: Path, session_name: str) -> str:
    """The command that resumes this run from its last checkpoint."""
    session = "" if session_name == "vf-rl" else f" -s {shlex.quote(session_name)}"
    return f"vf-rl @ {shlex.quote(str(config_path))}{session} --resume"


def wait_for_trainer(server, session_name: str, logs: Path, resume_hint: str, poll: float = 1.0,
                     linger: float = 2.0) -> int:
    """Block until the trainer pane writes its exit status to ``logs/trainer.exit``; ``linger``
    seconds later (the inference server stops on its Ctrl-C meanwhile) close the session.
    On a failure, print why: the inference server's last error lines if it exited first, and
    the command that resumes. Returns the trainer's status."""
    exit_file = logs / "trainer.exit"
    while not exit_file.exists() or not exit_file.read_text().strip():
        if not server.has_session(session_name):
            print("vf-rl: the tmux session ended before the trainer finished", file=sys.stderr)
            return 1
        time.sleep(poll)
    code = int(exit_file.read_text().strip())
    time.sleep(linger)
    if server.has_session(session_name):
        server.kill_session(session_name)
    print(f"vf-rl: trainer exited with status {code} (logs: {logs / 'trainer.log'}, {logs / 'inference.log'})")
    if code not in (0, SIGINT_STATUS):
        report_failure(logs, code, resume_hint)
    return code


def report_failure(logs: Path, code: int, resume_hint: str) -> None:
    """Why the run stopped, on stderr: the process that failed first (the inference server, when
    it exited with an error before the trainer did; else the trainer) with its last log lines,
    then how to go on: ``--resume`` when a checkpoint exists, else starting again."""
    exit_file, server_exit = logs / "trainer.exit", logs / "inference.exit"
    status = server_exit.read_text().strip() if server_exit.is_file() else ""
    server_failed = status.lstrip("-").isdigit() and int(status) not in (0, SIGINT_STATUS)
    if server_failed and server_exit.stat().st_mtime <= exit_file.stat().st_mtime:
        print(f"vf-rl: error: {exited_message(int(status), logs / 'inference.log')}", file=sys.stderr)
    else:
        log = logs / "trainer.log"
        lines = [line for line in (log.read_text(errors="replace").splitlines() if log.is_file() else [])
                 if line.strip()][-8:]
        print(f"vf-rl: error: the trainer failed (status {code}); the end of {log}:", file=sys.stderr)
        for line in lines:
            print(f"  {line[-300:]}", file=sys.stderr)
    if any(logs.parent.glob("checkpoint-*")):
        print(f"vf-rl: resume from the last checkpoint with: {resume_hint}", file=sys.stderr)
    else:
        print("vf-rl: no checkpoint was written yet: fix the cause and start the run again "
              f"({resume_hint.removesuffix(' --resume')})", file=sys.stderr)


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v if k != 'VF_RL_WEIGHT_SECRET' else '<generated>')}" for k, v in env.items())


def print_commands(config: VfRlConfig, config_path: Path) -> int:
    """``--print-commands``: one line for the inference server, one per trainer node (each to
    run on its own machine; node 0 is also what ``vf-rl @ cfg`` starts in tmux)."""
    gpus = check_gpus(config, visible_gpus(), dry_run=True, config_path=config_path)
    inference, _ = build_commands(config, config_path, gpus)
    print(f"# inference server\n{_env_text(inference.env)} {shlex.join(inference.argv)}")
    for rank in range(config.trainer.nodes):
        _, trainer = build_commands(config, config_path, gpus, node_rank=rank)
        print(f"# trainer node {rank} of {config.trainer.nodes}\n{_env_text(trainer.env)} {shlex.join(trainer.argv)}")
    return 0


def run_node(config: VfRlConfig, config_path: Path, node_rank: int, resume: bool) -> int:
    """``--node-rank K``: run trainer node ``K`` here in the foreground; its exit status."""
    import subprocess

    gpus = visible_gpus() or []
    if len(gpus) < config.trainer.gpus:
        raise ConfigError(f"{config_path}: trainer.gpus = {config.trainer.gpus}, but {len(gpus)} GPUs are visible here")
    _, trainer = build_commands(config, config_path, gpus, node_rank=node_rank)
    argv = trainer.argv + (["--resume"] if resume else [])
    print(f"vf-rl: trainer node {node_rank} of {config.trainer.nodes}: {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, env={**os.environ, **trainer.env}).returncode


def dry_run(config: VfRlConfig, config_path: Path, session_name: str) -> int:
    """``--dry-run``: the launch's checks (the config, the server's port; too few GPUs is a warning,
    so that a GPU config can be checked on any machine), then the pane commands and the resolved
    config ``vf-rl`` would write; starts and writes nothing.

    Raises:
        ConfigError: the server's port is taken.
    """
    resolved_path = config.output_dir / "resolved.toml"
    inference, trainer = build_commands(config, resolved_path, check_gpus(config, visible_gpus(), dry_run=True,
                                                                          config_path=config_path))
    host, port = config.server_address()  # as a launch checks it: a server already on the port
    check_port_free("0.0.0.0" if host not in LOOPBACK else "127.0.0.1", port)
    print(f"tmux session: {session_name}")
    for cmd in (inference, trainer):
        print(f"[{cmd.title}] {_env_text(cmd.env)} {shlex.join(cmd.argv)}")
    print(f"vf-vllm: {shlex.join(server_argv(config))}")
    memory = memory_line(config, visible_gpus(), config_path, refuse=False)
    if memory is not None:
        print(memory[1])
    print(f"\n# {resolved_path} (written at launch):")
    print(to_toml(config), end="")
    return 0
