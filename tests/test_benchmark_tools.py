"""benchmarks/cpu_ab.py: a variant can run the vf_rl of another git revision (old code vs new in one run)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git repository (not an export)")


def _cpu_ab():
    spec = importlib.util.spec_from_file_location("cpu_ab", REPO / "benchmarks" / "cpu_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rev_variant_imports_that_revisions_vf_rl(tmp_path):
    cpu_ab = _cpu_ab()
    src = cpu_ab.checkout_src("HEAD", tmp_path / "rev")
    assert (src / "vf_rl" / "__init__.py").is_file()
    # The variant's processes get src first on PYTHONPATH: vf_rl must come from there, not the installed package.
    out = subprocess.run([sys.executable, "-c", "import vf_rl; print(vf_rl.__file__)"], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert Path(out.stdout.strip()).resolve() == (src / "vf_rl" / "__init__.py").resolve()


def test_bad_revision_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not a git revision"):
        _cpu_ab().checkout_src("no-such-revision-xyz", tmp_path / "rev")
    assert not (tmp_path / "rev").exists()
