"""math-python: solve a math problem with a ``python`` tool, answer in ``\\boxed{}``.

The model may call ``python(code)`` any number of times (up to ``max_turns`` model turns);
each call runs the code in a fresh Python subprocess and returns its standard output (and
the error text if it failed). Reward: ``MathRubric`` on the last ``\\boxed{}`` of the final
reply, as in verifiers' ``math-python``; ``num_tool_calls`` is reported as a metric.

Sandbox (``run_python``): the code never runs in the trainer's process. Each call starts
``python -I`` in a new session with an empty environment and a fresh temporary working
directory, under ``setrlimit`` limits on address space (``memory_mb``, default 512 MB), CPU
time and file size, and is killed (with its children) after ``timeout`` seconds (default
10). Before the code runs, the child replaces ``socket.socket`` with a class that refuses
to be created, so ordinary network use fails. This is BEST-EFFORT isolation against
accidents and runaway code, not a security boundary: the code runs as the trainer's user
and can read its files, and a determined program can reach the raw ``_socket`` module.
Untrusted models at scale need a real sandbox (a container or VM without network; the
original uses Prime sandboxes).

Data: by default the gsm8k environment's data (``openai/gsm8k`` from the hub, or its
shipped SYNTHETIC GSM8K-style sample offline; see ``vf_rl.environments.gsm8k``). The
original's hub dataset (``dataset_name="PrimeIntellect/INTELLECT-3-RL"``,
``dataset_subset="math"``, columns ``question`` and ``answer``) can be named instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from datasets import Dataset, load_dataset

from vf_rl.env_api import BoxedParser, MathRubric, ToolEnv, num_tool_calls
from vf_rl.env_api.hub import check_source, hub_offline
from vf_rl.environments.gsm8k import load_gsm8k

SYSTEM_PROMPT = ("Solve the math problem. You can run Python code with the python tool; it returns what the code "
                 "prints. Use it for calculations. Explain your reasoning and put the final answer inside "
                 "\\boxed{}, for example \\boxed{42}.")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_CHARS = 4000
MAX_FILE_BYTES = 16 * 1024 * 1024  # largest file (stdout included) the code may write

# Runs in the child before the user's code (read from stdin): set the resource limits (soft =
# hard, so the code cannot raise them), block sockets, then run the code as ``__main__`` and
# print its traceback without this wrapper's frame. The limits are set here rather than in a
# ``preexec_fn``: ``preexec_fn`` is unsafe in a multi-threaded parent (the trainer is one, and
# ToolEnv runs tools in threads), where the forked child can deadlock before ``exec``.
_BOOTSTRAP = r"""
import resource, socket, sys, traceback
_memory, _cpu, _fsize = (int(a) for a in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (_memory, _memory))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
class _NoNetwork(socket.socket):
    def __init__(self, *args, **kwargs):
        raise OSError("network access is disabled in this sandbox")
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")
socket.socket = socket.SocketType = _NoNetwork
socket.create_connection = socket.socketpair = socket.fromfd = _no_network
sys.stdout.reconfigure(encoding="utf-8", errors="replace")
sys.stderr.reconfigure(encoding="utf-8", errors="replace")
_code = sys.stdin.read()
try:
    exec(compile(_code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _exc:
    traceback.print_exception(type(_exc), _exc, _exc.__traceback__.tb_next)
    sys.exit(1)
"""


def _truncate(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [output truncated: {len(text)} characters, showing the first {max_chars}]"


def run_python(code: str, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
               max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> str:
    """Run ``code`` in a separate, resource-limited Python process and return its output.

    The child is ``sys.executable -I`` (isolated mode: no user site, no ``PYTHON*`` variables)
    with an empty environment (but one-thread BLAS settings), a fresh temporary working
    directory (deleted afterwards), ``RLIMIT_AS = memory_mb`` MiB, a CPU-time limit, a 16 MiB
    file-size limit, and sockets disabled (best-effort, see the module docstring).

    Args:
        code: Python source, run as ``__main__``.
        timeout: wall-clock seconds before the process (and its children) is killed.
        memory_mb: address-space limit in MiB; allocations beyond it raise ``MemoryError``.
        max_output_chars: the returned text is cut to this many characters (plus a note).
    Returns:
        The standard output, stripped of trailing whitespace. If the code failed, its error
        text (the traceback) follows; on a timeout or a kill, a line saying so.
        ``"(no output)"`` if the code printed nothing and succeeded. Never raises for
        errors in ``code``.
    Raises:
        ValueError: non-positive ``timeout``, ``memory_mb`` or ``max_output_chars``.
    """
    if timeout <= 0 or memory_mb <= 0 or max_output_chars <= 0:
        raise ValueError(f"run_python: timeout, memory_mb and max_output_chars must be positive, "
                         f"got {timeout}, {memory_mb}, {max_output_chars}")
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="vf-python-") as tmp:
        workdir = Path(tmp, "work")
        workdir.mkdir()
        out_path, err_path = Path(tmp, "stdout"), Path(tmp, "stderr")
        # Output goes to files (bounded by RLIMIT_FSIZE), not pipes, so a print loop cannot
        # fill the trainer's memory.
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP, str(memory_mb * 1024 * 1024), str(int(timeout) + 1),
                 str(MAX_FILE_BYTES)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=workdir, env=env, start_new_session=True)
            status = None
            try:
                process.communicate(code.encode("utf-8", errors="replace"), timeout=timeout)
            except subprocess.TimeoutExpired:
                status = f"Error: execution timed out after {timeout:g} s (the process was killed)"
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the child and anything it started
                except ProcessLookupError:
                    pass
                process.wait()
        stdout = out_path.read_bytes()[: 4 * max_output_chars].decode("utf-8", errors="replace").rstrip()
        stderr = err_path.read_bytes()[-4 * max_output_chars:].decode("utf-8", errors="replace").rstrip()
    if status is None and process.returncode < 0:
        name = signal.Signals(-process.returncode).name
        reason = {"SIGXFSZ": "output or file size limit exceeded", "SIGXCPU": "CPU time limit exceeded",
                  "SIGKILL": "killed, probably out of memory"}.get(name, "killed")
        status = f"Error: the process died with {name} ({reason})"
    parts = [p for p in (stdout, stderr if (process.returncode or status) else "", status) if p]
    return _truncate("\n".join(parts), max_output_chars) if parts else "(no output)"


def _make_python_tool(timeout: float, memory_mb: int, max_output_chars: int):
    def python(code: str) -> str:
        """Run Python code in a fresh interpreter and return what it prints.

        Each call starts from scratch (no variables are kept between calls). Use print() to see
        results. The standard library is available; there is no network and no input().

        Args:
            code: the Python program to run, e.g. "print(17 * 23)".
        """
        return run_python(code, timeout=timeout, memory_mb=memory_mb, max_output_chars=max_output_chars)

    return python


def _hub_rows(dataset_name: str, dataset_subset: str | None, split: str, source: str, num_examples: int) -> Dataset:
    if source == "offline" or (source == "auto" and hub_offline()):
        raise ValueError(f"math-python: dataset_name={dataset_name!r} needs the hub, but source={source!r}"
                         + (" and HF_HUB_OFFLINE=1" if source == "auto" else ""))
    ds = load_dataset(dataset_name, dataset_subset, split=split)
    if num_examples > 0:
        ds = ds.select(range(min(num_examples, len(ds))))
    return ds.map(lambda x: {"question": x["question"], "answer": str(x["answer"]), "task": "math-python"})


def load_environment(system_prompt: str | None = SYSTEM_PROMPT, source: str = "auto",
                     dataset_name: str | None = None, dataset_subset: str | None = None,
                     dataset_split: str = "train", num_train_examples: int = -1, num_eval_examples: int = -1,
                     max_turns: int = 5, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                     max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, tool_choice="auto") -> ToolEnv:
    """Build the math-python environment.

    Args:
        system_prompt: tells the model about the python tool and the ``\\boxed{}`` answer.
        source: ``"auto"`` (hub, else the offline synthetic sample), ``"hub"`` or ``"offline"``.
        dataset_name: ``None`` (default): gsm8k's data (train and test splits). Otherwise a hub
            dataset with ``question`` and ``answer`` columns, e.g. the original's
            ``"PrimeIntellect/INTELLECT-3-RL"`` with ``dataset_subset="math"``; it has no eval
            split, so the environment then has training rows only.
        dataset_subset, dataset_split: config and split of ``dataset_name``.
        num_train_examples, num_eval_examples: first rows to keep (-1: all).
        max_turns: most model turns per rollout (>= 1).
        timeout: seconds one ``python`` call may run (wall clock).
        memory_mb: address-space limit of one ``python`` call, MiB.
        max_output_chars: longest tool result returned to the model, characters.
        tool_choice: passed to the server; ``{"type": "function", "function": {"name": "python"}}``
            forces a call on every turn (used in tests).
    Raises:
        ValueError: bad ``source``, example counts, limits or ``max_turns``; or a hub
            ``dataset_name`` with ``source="offline"``.
    """
    check_source(source, "math-python")
    if timeout <= 0 or memory_mb < 64 or max_output_chars <= 0:
        raise ValueError(f"math-python: need timeout > 0 s, memory_mb >= 64 and max_output_chars > 0, "
                         f"got {timeout}, {memory_mb}, {max_output_chars}")
    if max_turns < 1:
        raise ValueError(f"math-python: max_turns must be >= 1, got {max_turns}")
    if dataset_name is None:
        train = load_gsm8k("train", source, num_examples=num_train_examples)
        test = load_gsm8k("test", source, num_examples=num_eval_examples)
    else:
        train = _hub_rows(dataset_name, dataset_subset, dataset_split, source, num_train_examples)
        test = None
    parser = BoxedParser()
    rubric = MathRubric(funcs=[num_tool_calls], weights=[0.0], parser=parser)
    tool = _make_python_tool(timeout, memory_mb, max_output_chars)
    return ToolEnv(tools=[tool], max_turns=max_turns, tool_timeout=timeout + 5, tool_choice=tool_choice,
                   dataset=train, eval_dataset=test, system_prompt=system_prompt, parser=parser, rubric=rubric)
