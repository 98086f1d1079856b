"""``vf-rl install-verifiers-classic``: the classic API of PrimeIntellect's ``verifiers`` (0.2-0.3,
``SingleTurnEnv``, ``Rubric``, ``load_environment``) installed beside vLLM.

    vf-rl install-verifiers-classic [--verifiers-version 0.3.1] [--target DIR]

``verifiers`` 0.4 (the ``verifiers`` extra) is v1 only. Its 0.2-0.3 releases pin ``mcp<2``, which
vLLM's CPU build refuses (``mcp>=2``), so no single ``pip install`` resolves both: this command
installs the release without that pin and every other package it needs, as one ``pip install`` of
the release would (pip's own plan, ``--dry-run --report``), except ``mcp``, which stays vLLM's.
``verifiers`` imports mcp only in its experimental ``MCPEnv``.

Without ``--target`` it installs into this Python's environment (replacing verifiers 0.4 there);
with ``--target DIR`` into an overlay directory instead, used as ``PYTHONPATH=DIR vf-rl @ cfg``, so
one environment keeps 0.4 and runs classic environments with the overlay.

Exit status: 0 installed; 1 pip failed (its last lines printed); 2 bad arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_VERSION = "0.3.1"
KEPT = {"mcp"}
"""Packages the classic release pins that vLLM pins otherwise: vLLM's are kept."""


def plan(version: str) -> list[str]:
    """``name==version`` of every package ``pip install verifiers==<version>`` would install or
    change in this environment, but :data:`KEPT`.

    Raises:
        RuntimeError: pip could not plan the install (its last lines).
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                               f"verifiers=={version}"], capture_output=True, text=True)
        if done.returncode != 0 or not report.is_file():
            raise RuntimeError(_tail(done))
        items = json.loads(report.read_text())["install"]
    return [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items
            if i["metadata"]["name"].lower() not in KEPT]


def install(version: str, target: Path | None) -> None:
    """Install :func:`plan`'s packages without their dependencies (the plan holds them), into this
    environment or into ``target``.

    Raises:
        RuntimeError: pip failed (its last lines).
    """
    where = ["--target", str(target), "--upgrade"] if target is not None else []
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *where, *plan(version)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(_tail(done))


def _tail(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stderr + done.stdout).splitlines()
             if line.strip() and not line.startswith("WARNING: Location")]
    return "\n".join(lines[-5:]) or f"pip exited with {done.returncode}"


USAGE = """vf-rl install-verifiers-classic [--verifiers-version VERSION] [--target DIR]
       vf-rl install-verifiers-classic -h | --help | --version"""

DESCRIPTION = """\
Install the classic API of PrimeIntellect's verifiers (0.2-0.3: SingleTurnEnv, Rubric,
load_environment) beside vLLM. verifiers 0.4, the `verifiers` extra, is the v1 API only; its 0.2-0.3
releases pin mcp<2, which vLLM refuses, so this installs the release and what it needs except mcp.
Without --target it installs into this Python's environment (replacing verifiers 0.4 there)."""

EPILOG = """\
exit status: 0 installed; 1 pip failed (its last lines printed); 2 bad arguments."""


def main(argv: list[str] | None = None) -> int:
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser("vf-rl install-verifiers-classic", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--verifiers-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"The classic release to install, 0.2.1 to 0.3.x (default {DEFAULT_VERSION}, the tested one).")
    parser.add_argument("--target", type=Path, default=None, metavar="DIR",
                        help="Install into this overlay directory (use it as PYTHONPATH) instead of this environment.")
    opts = parser.parse_args(argv)
    version = opts.verifiers_version
    if not version.startswith(("0.2.", "0.3.")):
        print(f"vf-rl install-verifiers-classic: error: --verifiers-version {version}: the classic API is "
              "0.2.x-0.3.x (0.4 is the `verifiers` extra: pip install 'vf-rl[verifiers]')", file=sys.stderr)
        return 2
    try:
        install(version, opts.target)
    except RuntimeError as exc:
        print(f"vf-rl install-verifiers-classic: error: pip failed:\n{exc}", file=sys.stderr)
        return 1
    where = f"in {opts.target} (run with PYTHONPATH={opts.target})" if opts.target else "in this environment"
    print(f"vf-rl install-verifiers-classic: verifiers {version} installed {where}; mcp left as vLLM needs it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
