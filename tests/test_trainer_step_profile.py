"""benchmarks/trainer_step.py --profile: where a step's time goes, and its trace for a timeline."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def test_a_profiled_step_writes_a_chrome_trace_per_side(tmp_path):
    trace = tmp_path / "traces" / "step.json.gz"
    result = subprocess.run(
        [sys.executable, "benchmarks/trainer_step.py", "--model-config", "tiny", "--batch", "4", "--micro-batch", "2",
         "--prompt-len", "8", "--completion-len", "8", "--steps", "1", "--warmup", "0", "--no-grad-check",
         "--sides", "vf-rl", "--profile", "--trace", str(trace)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    written = tmp_path / "traces" / "step-vf-rl.json.gz"
    assert f"[vf-rl] trace: {written}" in result.stdout
    events = json.loads(gzip.decompress(written.read_bytes()))["traceEvents"]
    assert any("aten::" in str(e.get("name")) for e in events)  # the step's operators are in it


def test_device_gaps_count_the_time_no_kernel_ran():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import trainer_step
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def event(start, end, device="CUDA", name="k"):
        return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=SimpleNamespace(name=device),
                               name=name)

    # kernels 0-100 and 50-150 overlap, a 10 us gap, 160-200, a 200 us gap, 400-500, a 30 us gap, 530-540;
    # a CPU op spans it all
    lines = trainer_step.device_gaps([event(160, 200, name="add"), event(0, 100, name="gemm"),
                                      event(50, 150, name="flash"), event(400, 500, name="gemm"),
                                      event(530, 540, name="add"), event(0, 1000, "CPU", name="aten::mm")]).split("\n")
    assert lines == ["device: 0.3 ms busy of 0.5 ms from first to last kernel; idle in 1 gaps >= 50 us: 0.2 ms "
                     "(largest 0.2 ms), in shorter ones 0.0 ms",
                     "  idle before: gemm 0.2 ms (1); add 0.0 ms (2)",
                     "  largest gaps: 0.2 ms add -> gemm"]
    assert trainer_step.device_gaps([event(0, 10, "CPU")]) == "no kernel events"


def test_a_short_last_sequence_and_the_heartbeat(tmp_path):
    """``--last-completion-len``: the fixed batch's last sequence is that short (the step's tokens
    say so); ``--heartbeat``: lines while a step runs; a last length above ``--completion-len`` is
    refused with one line."""
    out = tmp_path / "step.json"
    base = [sys.executable, "benchmarks/trainer_step.py", "--model-config", "tiny", "--batch", "4", "--micro-batch", "1",
            "--prompt-len", "8", "--completion-len", "8", "--steps", "1", "--warmup", "0", "--no-grad-check",
            "--sides", "vf-rl"]
    result = subprocess.run(base + ["--last-completion-len", "3", "--heartbeat", "0.001", "--json", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text())["results"]["vf-rl"]["tokens_per_step"] == 3 * (8 + 8) + 8 + 3
    assert "[vf-rl] step running for" in result.stdout and "the last with 3 completion" in result.stdout
    bad = subprocess.run(base + ["--last-completion-len", "9"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--last-completion-len" in bad.stderr.strip().splitlines()[-1]
