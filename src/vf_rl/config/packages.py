"""torch's companion packages (torchvision, torchaudio, torchcodec) that cannot load beside the
installed torch, hidden from this process.

vLLM's CPU build declares the three companions without naming a build, so a plain ``pip install``
without PyTorch's CPU index takes their CUDA builds from PyPI, next to the CPU torch that vLLM's CPU
build pins. Importing such a companion fails (``operator torchvision::nms does not exist``), and
transformers imports torchvision whenever it is installed, so its ``Trainer`` would not import. The
text models vf-rl trains need none of the three: :func:`hide_mismatched_companions` marks a CUDA build
of a companion next to a CPU torch as not installed (``sys.modules[name] = None``: ``import`` raises
``ImportError`` and ``importlib.util.find_spec`` returns ``None``, which is how transformers asks).
It reads the packages' ``version.py`` files and imports nothing.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from vf_rl.config.errors import ConfigError

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def _version_text(name: str) -> str | None:
    """The text of package ``name``'s ``version.py``, or ``None`` (not installed, or none)."""
    if name in sys.modules and sys.modules[name] is None:
        return None  # hidden already
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "version.py"
        if path.is_file():
            return path.read_text(errors="replace")
    return None


def torch_is_cpu_build(text: str) -> bool:
    """Whether torch's ``version.py`` text is a CPU build's: no CUDA version and no ROCm one."""
    return bool(re.search(r"^cuda(:[^=\n]*)?= None", text, re.M)) and not re.search(r"^hip(:[^=\n]*)?= '", text, re.M)


def cuda_build(text: str) -> bool:
    """Whether a companion's ``version.py`` text names a CUDA build (``__version__ = '0.28.0+cu130'``)."""
    return bool(re.search(r"^__version__ = ['\"][^'\"]*\+cu\d", text, re.M))


def hide_mismatched_companions() -> list[str]:
    """Mark every CUDA build of a companion as not installed when torch is a CPU build; returns
    the names hidden (none where the builds match, torch is not installed, or transformers was
    imported first: it has read what is installed, and a process that imports it before vf-rl
    needs PyTorch's CPU index at install time)."""
    if "transformers" in sys.modules:  # it has decided what is installed already: hiding now would break it
        return []
    torch_text = _version_text("torch")
    if torch_text is None or not torch_is_cpu_build(torch_text):
        return []
    hidden = []
    for name in COMPANIONS:
        text = None if name in sys.modules else _version_text(name)  # an imported one loaded: leave it
        if text is not None and cuda_build(text):
            sys.modules[name] = None  # type: ignore[assignment]
            hidden.append(name)
    return hidden


class MissingExtra(ConfigError):
    """A package an optional part of vf-rl needs is not installed: the message names the part, the
    package and the extra that installs it (one line)."""


def require(module: str, package: str, extra: str, needed_by: str):
    """``import module`` for ``needed_by`` (e.g. ``"the gsm8k environment"``).

    Raises:
        MissingExtra: ``"<needed_by> needs <package>: pip install 'vf-rl[<extra>]'"`` when it is
            not installed.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there, something it imports is not: its own error says what
        raise MissingExtra(f"{needed_by} needs {package}, which is not installed: pip install 'vf-rl[{extra}]'") from None
