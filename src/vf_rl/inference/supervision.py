"""The inference server as ``vf-rl`` runs it: restarted when killed, its fate written to files.

``vf-rl`` runs ``vf-vllm`` in the Inference pane under a small bash loop (``supervised_shell``).
When the server stops without a Ctrl-C in its pane while the trainer still runs, the loop restarts
it: killed by a signal (an OOM kill is ``SIGKILL``, status 137), or ended with status 0, which is
how vLLM's API server ends once its engine process has died (vLLM shuts the HTTP server down
within seconds of finding the engine dead) or after a plain ``kill``. It restarts the server at
most ``MAX_RESTARTS`` times in a row with a growing pause, and appends a line to
``inference.restarts``. A server that ran for ``STABLE_S`` seconds or more before it stopped had
started and served, so it is not a crash loop: its count starts again (an hour-long run survives an
OOM kill every few minutes). Any other end (a start-up error, status 1 to 128; Ctrl-C, which the
loop's own trap sees; the trainer done; restarts used up) is final: the status goes to
``inference.exit``.
The trainer reads those files through ``VF_RL_INFERENCE_EXIT_FILE`` / ``VF_RL_INFERENCE_LOG``
and stops within seconds of a final exit, naming the server's last error lines.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

MAX_RESTARTS = 3
RESTART_PAUSE_S = 5
STABLE_S = 120
SIGINT_STATUS = 130


LOG_FILTER = r"s/.*\r//"
"""The ``sed`` script a pane's log file is written through: each line keeps what follows its last
carriage return, what a terminal shows of it at the end. A progress bar redrawn in place (tqdm's
``\r`` updates) leaves its final state, one line per finished bar, and a bar cleared away leaves
nothing."""

EXIT_NOISE = ("/^nanobind: /d", r"/^ - leaked \(instance\|type\|function\) /d", r"/^ - \.\.\. skipped remainder$/d",
              r"/^See https:\/\/nanobind\.readthedocs\.io/d")
"""``sed`` scripts for the lines the server's processes print at exit that name nothing a user can
act on: the leak report of triton's nanobind extension (``nanobind: leaked 514 functions!``, each
leaked object, the link to nanobind's docs), which has no switch."""


class ServerExited(RuntimeError):
    """The inference server that ``vf-rl`` launched has exited for good; the message names its
    status, its last error lines and its log file."""


def supervised_shell(command: str, log: Path, exit_file: Path, restarts_file: Path, trainer_exit: Path,
                     stable_s: int = STABLE_S) -> str:
    """The bash line of the Inference pane: ``command`` in a restart loop, as the module docstring
    describes (``stable_s``: seconds of uptime that reset the restart count). Its output goes to the
    pane without :data:`EXIT_NOISE`, and is appended to ``log`` through :data:`LOG_FILTER`."""
    q = shlex.quote  # a subshell that survives Ctrl-C, as launch.PaneCommand.shell
    # the filters ignore Ctrl-C as tee -i does (the server's own status is PIPESTATUS[0]); the log's
    # writer is waited for before the status is read
    quiet = "sed -u " + " ".join(f"-e {q(script)}" for script in EXIT_NOISE)
    return (f"( c=0; trap c=1 INT; rm -f {q(str(exit_file))} {q(str(restarts_file))}; n=0; while :; do t=$(date +%s); "
            f"{command} 2>&1 | (trap '' INT; exec {quiet}) | tee -i >(trap '' INT; exec sed -u {q(LOG_FILTER)} "
            f">> {q(str(log))}); code=${{PIPESTATUS[0]}}; wait $!; "
            f"if [ $(( $(date +%s) - t )) -ge {int(stable_s)} ]; then n=0; fi; "
            f"if [ -s {q(str(trainer_exit))} ] || [ $c = 1 ] || {{ [ $code -ge 1 ] && [ $code -le 128 ]; }} "
            f"|| [ $code -eq {SIGINT_STATUS} ] "
            f"|| [ $n -ge {MAX_RESTARTS} ]; then break; fi; n=$((n+1)); "
            f"echo \"$(date +%s) status $code\" >> {q(str(restarts_file))}; "
            f"echo \"[vf-rl] inference server stopped (status $code: killed, or its engine died): restart "
            f"$n/{MAX_RESTARTS} in $((n*{RESTART_PAUSE_S}))s\"; "
            f"sleep $((n*{RESTART_PAUSE_S})); done; echo $code > {q(str(exit_file))}; "
            f"echo \"[exited with status $code]\" )")


def final_exit_status() -> int | None:
    """The launched server's final exit status, or ``None`` while it runs (or is being
    restarted), or when this process was not started by ``vf-rl``."""
    path = os.environ.get("VF_RL_INFERENCE_EXIT_FILE")
    if not path or not Path(path).is_file():
        return None
    text = Path(path).read_text().strip()
    return int(text) if text.lstrip("-").isdigit() else None


def last_error_lines(log: Path | str | None = None, count: int = 3) -> list[str]:
    """The last ``count`` lines of the server's log that name an error (else its last lines)."""
    log = Path(log or os.environ.get("VF_RL_INFERENCE_LOG", ""))
    if not log.is_file():
        return []
    lines = [line.strip()[:400] for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(?i)\berror\b|exception", line)
              and not re.search(r"\b(WARNING|INFO|DEBUG)\b", line)
              and not line.startswith(("[vf-rl]", "For further information"))]
    return (errors or lines)[-count:]


def exited_message(status: int, log: Path | str | None = None) -> str:
    """One paragraph: the status, the last error lines, the log path."""
    log = log or os.environ.get("VF_RL_INFERENCE_LOG", "")
    lines = last_error_lines(log)
    cause = ("; last error: " + " | ".join(lines)) if lines else ""
    how = "stopped with Ctrl-C" if status == SIGINT_STATUS else f"exited with status {status}"
    return f"the inference server {how}{cause} (log: {log})"


def check_server_alive() -> None:
    """Raise :class:`ServerExited` if the launched server has exited for good."""
    status = final_exit_status()
    if status is not None:
        raise ServerExited(exited_message(status))
