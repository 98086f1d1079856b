"""vf-vllm: vLLM's OpenAI-compatible server plus vf-rl's weight-update routes.

    vf-vllm --model MODEL [any `vllm serve` flag ...]
    vf-vllm @ config.toml [more flags ...]     (model and [inference.args] from a vf-rl config)

Adds, unless given: ``--host 127.0.0.1``, ``--logprobs-mode processed_logprobs`` (log-probs
after temperature, which is what the trainer's importance ratio compares against),
``--disable-uvicorn-access-log`` (no line per request; ``--no-disable-uvicorn-access-log``
keeps them), the worker extension that reloads weights, and the routes middleware. With no CUDA device
it also defaults to ``--dtype float32`` (bf16 falls back to a slow path on CPUs without
bf16 support) and ``--no-enable-chunked-prefill`` (:data:`CPU_CHUNKED_PREFILL_FLAG`), and gives
vLLM's CPU worker every core.
"""

from __future__ import annotations

import os
import sys
import time

from vf_rl.config.vllm_flags import vllm_version_fallback

EXTENSION = "vf_rl.inference.worker_extension.WeightSyncExtension"
MIDDLEWARE = "vf_rl.inference.routes.weight_sync_routes"


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


#: vLLM flags that serve the token-in/token-out route ``/inference/v1/generate`` in the shape
#: verifiers v1's training client (``verifiers.v1.TrainClientConfig``) calls and parses.
TOKEN_ROUTE_FLAGS = ("--enable-scale-out", "--return-tokens-as-token-ids")

#: vLLM's switch for uvicorn's access log, a line per HTTP request (hundreds per training step:
#: every rollout's /tokenize and completion). vf-vllm turns it on (no access log) unless its flags
#: name it; ``--no-disable-uvicorn-access-log`` (``disable_uvicorn_access_log = false`` in
#: ``[inference.args]``) brings the log back.
ACCESS_LOG_FLAG = "--disable-uvicorn-access-log"

#: vLLM's chunked prefill, off by default on the CPU: a prompt whose prefill is split over engine
#: steps has the token sampled at its partial step thrown away, and for a seeded request
#: (``seed`` in the sampling arguments; group sampling seeds each child) vLLM then rewinds the
#: request's random generator by its offset, which torch's CPU generator does not have: the
#: worker raises ``RuntimeError: CPU Generator does not use offset`` and the engine dies. Without
#: chunked prefill every prompt is prefilled in one step and nothing is thrown away.
#: ``--enable-chunked-prefill`` (``enable_chunked_prefill = true``) turns it back on.
CPU_CHUNKED_PREFILL_FLAG = "--enable-chunked-prefill"


def _has_switch(argv: list[str], flag: str) -> bool:
    """Whether ``argv`` sets the boolean ``flag`` either way (``--flag`` or ``--no-flag``)."""
    return _has_flag(argv, flag) or _has_flag(argv, "--no-" + flag[2:])


def token_route_flags() -> list[str]:
    """The :data:`TOKEN_ROUTE_FLAGS` this vLLM knows (none on a vLLM without the route or
    without vLLM installed), so that vf-vllm starts on versions that lack them."""
    try:
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
    except Exception:  # an older vLLM (no scale-out launcher) or none
        return []
    fields = set(getattr(FrontendArgs, "__dataclass_fields__", {}))
    return [f for f in TOKEN_ROUTE_FLAGS if f[2:].replace("-", "_") in fields]


def serve_argv(argv: list[str], cpu: bool) -> list[str]:
    """The ``vllm serve`` arguments vf-vllm runs for the user's ``argv``: the module docstring's
    defaults where ``argv`` does not set them, the worker extension and the routes middleware.

    Raises:
        SystemExit: ``argv`` sets ``--worker-extension-cls``.
    """
    argv = list(argv)
    defaults = [("--host", "127.0.0.1"), ("--logprobs-mode", "processed_logprobs")]
    if cpu:
        defaults.append(("--dtype", "float32"))
    for flag, value in defaults:
        if not _has_flag(argv, flag):
            argv += [flag, value]
    if _has_flag(argv, "--worker-extension-cls"):
        raise SystemExit("vf-vllm: --worker-extension-cls is set by vf-vllm itself (weight sync needs it)")
    if not _has_switch(argv, ACCESS_LOG_FLAG):
        argv.append(ACCESS_LOG_FLAG)
    if cpu and not _has_switch(argv, CPU_CHUNKED_PREFILL_FLAG):
        argv.append("--no-enable-chunked-prefill")
    for flag in token_route_flags():  # imports vLLM (which prints): after the checks of the user's flags
        if not _has_switch(argv, flag):
            argv.append(flag)
    argv += ["--worker-extension-cls", EXTENSION, "--middleware", MIDDLEWARE]
    for i, arg in enumerate(argv):  # `vllm serve MODEL`: the --model option is deprecated
        if arg == "--model" and i + 1 < len(argv):
            return [argv[i + 1], *argv[:i], *argv[i + 2:]]
        if arg.startswith("--model="):
            return [arg.split("=", 1)[1], *argv[:i], *argv[i + 1:]]
    return argv


def server_argv(config) -> list[str]:
    """vf-vllm's flags for a resolved ``config`` (a ``VfRlConfig``): ``--model`` and ``[inference.args]``."""
    from vf_rl.config.vllm_flags import inference_flags

    return ["--model", config.model, *inference_flags(config.inference.args)]


def config_argv(argv: list[str]) -> list[str]:
    """``@ config.toml [flags]`` -> ``--model`` and the flags of the resolved config's
    ``[inference.args]`` (a ``resolved.toml`` that vf-rl wrote is read as it is), then ``flags``.

    Raises:
        ConfigError: bad config (one line).
    """
    from vf_rl.config.schema import load_config, parse_at_args
    from vf_rl.env_api.checks import check_environments

    path, rest = parse_at_args(argv, "vf-vllm")
    config = load_config(path)
    check_environments(config, path)  # a bad [env] stops the server as it stops vf-rl and vf-train
    return server_argv(config) + rest


VLLM_WARNING_FILTERS = ("ignore::FutureWarning", "ignore:resource_tracker:UserWarning")
"""Python warnings the server pane does not show: vLLM's own deprecation notices (about vLLM's
code, nothing a user can change) and the leak report of its worker processes' resource tracker
when the server is stopped."""


def quiet_vllm_warnings() -> None:
    """Apply ``VLLM_WARNING_FILTERS`` here and, through ``PYTHONWARNINGS``, in every process vLLM
    starts; the user's own ``PYTHONWARNINGS`` entries come after ours and take precedence."""
    import builtins
    import warnings

    for entry in VLLM_WARNING_FILTERS:
        action, message, category = entry.split(":")
        warnings.filterwarnings(action, message=message, category=getattr(builtins, category))
    user = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join([*VLLM_WARNING_FILTERS, *([user] if user else [])])


GRACEFUL_SHUTDOWN_S = 10
"""Seconds the API server waits for open requests once it is told to stop (Ctrl-C, SIGTERM, a
dead engine) before it cancels them."""


def bound_graceful_shutdown(seconds: float = GRACEFUL_SHUTDOWN_S) -> None:
    """Give the HTTP server's graceful shutdown a deadline. vLLM builds its ``uvicorn.Config``
    without ``timeout_graceful_shutdown``, so on Ctrl-C uvicorn waits for every open request to
    finish; when the engine core has died first, the requests it was serving never finish and the
    server hangs on "Waiting for connections to close" with its pane and port held. The default
    set here makes uvicorn cancel them after ``seconds``."""
    import functools

    import uvicorn

    init = uvicorn.Config.__init__
    if getattr(init, "vf_rl_bounded", False):
        return

    @functools.wraps(init)
    def bounded(self, *args, **kwargs):
        if kwargs.get("timeout_graceful_shutdown") is None:
            kwargs["timeout_graceful_shutdown"] = seconds
        init(self, *args, **kwargs)

    bounded.vf_rl_bounded = True
    uvicorn.Config.__init__ = bounded


def served_model(argv: list[str]) -> str | None:
    """The model ``argv`` serves, read cheaply: ``model`` of the TOML file of ``@ config.toml``
    (the file as it is, before it is resolved and checked), else ``--model`` or the positional
    model; ``None`` when none is readable."""
    if argv and argv[0].startswith("@"):
        from vf_rl.config.schema import ConfigError, parse_at_args, read_toml

        try:
            model = read_toml(parse_at_args(argv, "vf-vllm")[0]).get("model")
        except ConfigError:  # config_argv reports it
            return None
        return model if isinstance(model, str) else None
    return _flag_value(argv, "--model") or (argv[0] if argv and not argv[0].startswith("-") else None)


USAGE = """vf-vllm --model MODEL [any vllm serve flag ...]
       vf-vllm MODEL [any vllm serve flag ...]
       vf-vllm @ config.toml [more vllm serve flags ...]
       vf-vllm -h | --help | --version"""

DESCRIPTION = """\
Serve a model with vLLM's OpenAI-compatible server, plus the routes through which vf-rl's
trainer updates the served weights while it trains. It is the server that vf-rl starts in its
"Inference" pane; started by hand, it serves a vf-train on this or another machine, vf-rl eval,
or any OpenAI client.

Every flag of vllm serve works here and means what it means there (vllm serve --help lists
them). With @ config.toml the model and the flags of the config's [inference.args] come from a
vf-rl config (a resolved.toml that vf-rl wrote is read as it is), then the flags given after it.

vf-vllm adds, unless given: --host 127.0.0.1; --logprobs-mode processed_logprobs (log-probs after
temperature, what the trainer's importance ratio compares against); --disable-uvicorn-access-log
(no log line per HTTP request; --no-disable-uvicorn-access-log keeps them); the token-in/token-out route
that verifiers v1's training client calls, where this vLLM has it; and, without a CUDA device,
--dtype float32 (bfloat16 falls back to a slow path on CPUs without bfloat16 support) and
--no-enable-chunked-prefill (a seeded request whose prompt is prefilled in parts kills vLLM's CPU
engine: "CPU Generator does not use offset"), with every core of this process given to vLLM's CPU
worker. It always adds the weight-update routes as a
--middleware and sets --worker-extension-cls, which is refused when given (weight sync needs it)."""

EPILOG = """\
environment:
  VF_RL_WEIGHT_SECRET       A secret that every weight-update route then requires in the header
                            X-VF-RL-Secret; needed to listen beyond loopback (--host 0.0.0.0).
  VF_RL_WEIGHT_SECRET_FILE  A file whose first line is that secret.

exit status: 0 the server stopped; 2 bad input (one line: a bad config, a host beyond loopback
without a secret, an unreadable secret file); otherwise vLLM's own status."""

HELP_FLAGS = ("-h", "--help", "--version")
"""vf-vllm's own help and version; vLLM's grouped help (``--help=all``, ``--help=ModelConfig``) passes through to vLLM."""


def help_parser():
    """The parser that prints ``vf-vllm --help`` and ``--version`` (every other flag is vLLM's)."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser("vf-vllm", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--model", metavar="MODEL",
                        help="The model to serve: a Hugging Face hub id or a local model directory (or give it as "
                             "the first argument).")
    parser.add_argument("--port", metavar="PORT", help="The port to listen on (vLLM's default: 8000).")
    parser.add_argument("--host", metavar="HOST",
                        help="The address to listen on (default here: 127.0.0.1, this machine only).")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in HELP_FLAGS for a in argv):  # before anything imports torch or vLLM
        parser = help_parser()
        if not argv:
            parser.print_help(sys.stderr)
            return 2
        parser.parse_args([next(a for a in argv if a in HELP_FLAGS)])  # prints the help or the version, exits 0
    from vf_rl.inference import model_info

    model = served_model(argv)
    inspection = model_info.start(model) if model else None  # beside everything below, torch's import included
    try:
        if argv and argv[0].startswith("@"):
            from vf_rl.config.schema import ConfigError

            try:
                argv = config_argv(argv)
            except ConfigError as exc:
                print(f"vf-vllm: error: {exc}", file=sys.stderr)
                return 2
        return _serve(argv, inspection)
    finally:  # a refused flag or a failed start: no inspection left running
        model_info.finish(inspection, timeout=0)


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU, asked through NVML (torch's ``PYTORCH_NVML_BASED_CUDA_CHECK``,
    falling back to the CUDA runtime where NVML fails). torch's default check calls
    ``cudaGetDeviceCount``, which initializes the CUDA driver in this process; vLLM's engine process
    could then not be forked from it (``VLLM_WORKER_MULTIPROC_METHOD=fork``), only spawned, which
    imports vLLM again on the way to the server's start."""
    import torch

    before = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if before is None:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = before


def engine_start_method(cpu: bool) -> None:
    """On a GPU, vLLM's engine process is forked from vf-vllm's (``VLLM_WORKER_MULTIPROC_METHOD=fork``
    unless the variable is set) rather than spawned, the default vLLM's CLI sets: a spawned engine
    imports vLLM afresh before its first log, seconds of a cold start. :func:`gpu_visible` leaves the CUDA driver
    uninitialized here, and vLLM spawns anyway where it finds it initialized. On the CPU the CLI's
    default stays."""
    if not cpu:
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")


def _serve(argv: list[str], inspection) -> int:
    """The server's checks, then vLLM's CLI once ``inspection`` (``model_info.start``'s process
    or ``None``) has filled vLLM's model-info cache."""
    import psutil

    from vf_rl.inference import model_info
    from vf_rl.inference.api_servers import overlap_engine_start

    cpu = not gpu_visible()
    engine_start_method(cpu)
    if cpu:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vf_rl.config.cpus import SERVER_CORES_ENV, format_cpu_list

        # every core this process may use (vf-rl sets the first half when the trainer shares the CPU)
        os.environ.setdefault(SERVER_CORES_ENV, format_cpu_list(sorted(os.sched_getaffinity(0))))
    if _has_flag(argv, "--enable-lora"):  # the trainer hot-loads its adapter (weight_sync = "lora")
        os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    host = _flag_value(argv, "--host") or "127.0.0.1"  # serve_argv's default; checked before vLLM is imported
    from vf_rl.inference.routes import weight_secret

    try:
        secret = weight_secret()
    except ValueError as exc:
        print(f"vf-vllm: error: {exc}", file=sys.stderr)
        return 2
    if host not in ("127.0.0.1", "localhost", "::1") and not secret:
        print(f"vf-vllm: error: --host {host} makes the weight-update routes reachable from other machines; set "
              "VF_RL_WEIGHT_SECRET (or VF_RL_WEIGHT_SECRET_FILE) here and for vf-train", file=sys.stderr)
        return 2
    vllm_version_fallback()
    quiet_vllm_warnings()
    bound_graceful_shutdown()
    serve = serve_argv(argv, cpu)
    sys.argv = ["vllm", "serve", *serve]
    print("vf-vllm:", " ".join(sys.argv), flush=True)
    from vllm.entrypoints.cli.main import main as vllm_main

    overlap_engine_start()
    model_info.finish(inspection)
    print(f"vf-vllm: vLLM starts {time.time() - psutil.Process().create_time():.1f} s after vf-vllm did", flush=True)
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
