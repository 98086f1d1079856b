"""``vf-rl view``: the rollouts a run records (``rollouts/step-NNNNNN.jsonl.gz``, every
``log_rollouts_every`` steps) and the page that shows two runs, opened in a real headless Chromium
(Debian's, driven by playwright): both runs' curves with the values of their metrics.jsonl, against
steps and seconds, the config keys that differ, and the rollouts of a chosen step by group.

The two runs are real ``vf-train`` runs of 2 steps against the session's vf-vllm (SmolLM2 on the
CPU), made once for the module."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from conftest import wait_for_memory, write_cpu_config

from vf_rl.launcher.view_data import groups, labels, message_text
from vf_rl.trainer.rollout_log import read_rollouts, rollouts_path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROLLOUTS_PER_EXAMPLE, BATCH_SIZE = 2, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_runs(server, model_dir, base_weights, tmp_path_factory) -> list[Path]:
    """Two real 2-step runs (learning rates 1e-4 and 2e-3) with the rollouts of every step recorded and
    a held-out evaluation before and after; the server gets the base weights back after each."""
    from vf_rl.inference.client import InferenceClient

    root = tmp_path_factory.mktemp("view-runs")
    runs = []
    for name, lr in (("low-lr", 1e-4), ("high-lr", 2e-3)):
        run = root / name
        config = write_cpu_config(root / f"{name}.toml", model_dir, run, server.port, run_name=name,
                                  micro_batch_size=4, rollouts_per_example=ROLLOUTS_PER_EXAMPLE, batch_size=BATCH_SIZE,
                                  max_steps=2, max_tokens=8, learning_rate=lr, seed=0, log_rollouts_every=1,
                                  eval_strategy="steps", eval_steps=2, num_eval_examples=2, eval_rollouts_per_example=2)
        try:
            trained = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)],
                                     capture_output=True, text=True, timeout=900)
        finally:
            InferenceClient(port=server.port).update_weights(str(base_weights))
        assert trained.returncode == 0, trained.stdout[-4000:] + trained.stderr[-4000:]
        runs.append(run)
    return runs


@pytest.mark.server
def test_a_run_records_the_rollouts_of_every_step_it_is_asked_to(two_runs):
    """Each recorded step: every rollout of the batch, grouped by prompt, with the prompt's messages, the
    completion, the dataset row's answer, a reward whose mean is the step's logged reward, and the
    advantage the step trained on (group_mean: the reward minus its group's mean)."""
    run = two_runs[0]
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step-000001.jsonl.gz", "step-000002.jsonl.gz"]
    steps = {r["step"]: r for r in records(run) if "reward" in r}
    for step in (1, 2):
        rollouts = read_rollouts(rollouts_path(run, step))
        assert len(rollouts) == BATCH_SIZE and {r["step"] for r in rollouts} == {step}
        assert sum(r["reward"] for r in rollouts) / BATCH_SIZE == pytest.approx(steps[step]["reward"])
        for group in groups(rollouts):
            assert len(group) == ROLLOUTS_PER_EXAMPLE and len({json.dumps(r["prompt"]) for r in group}) == 1
            mean = sum(r["reward"] for r in group) / len(group)
            for r in group:
                assert r["advantage"] == pytest.approx(r["reward"] - mean, abs=1e-6)
                assert r["prompt"][-1]["role"] == "user" and r["completion"][0]["role"] == "assistant"
                text = r["prompt"][-1]["content"]
                assert r["answer"] and r["answer"][::-1] in text  # reverse-text: the answer is the text reversed
                assert 0 < r["completion_tokens"] <= 8 and r["error"] is None


def test_view_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    taken = listener.getsockname()[1]
    for argv, expected in (([str(tmp_path / "missing")], "no such run directory"),
                           ([str(tmp_path / "empty")], "metrics.jsonl not found"),
                           ([str(tmp_path / "empty"), "--port", "x"], "--port: invalid int value"),
                           ([str(tmp_path / "run"), "--port", str(taken)], f"--port {taken}: cannot listen")):
        done = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "view", *argv], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr, done.stderr


def test_log_rollouts_every_below_0_is_refused_naming_the_key(tmp_path, model_dir):
    from vf_rl.config.schema import ConfigError, load_config

    config = write_cpu_config(tmp_path / "bad.toml", model_dir, tmp_path / "run", 8000, log_rollouts_every=-1)
    with pytest.raises(ConfigError, match=r"log_rollouts_every: expected log_rollouts_every >= 0 \(0: none\), got -1"):
        load_config(config)


def test_run_labels_are_unique_folder_names():
    assert labels([Path("/x/a/run"), Path("/x/b/run"), Path("/x/c")]) == ["a/run", "b/run", "c"]
    assert labels([Path("/x/a"), Path("/x/a")]) == ["a", "a (2)"]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert message_text(chat) == "user: hi\n\nassistant: yo" and message_text("plain text") == "plain text"


@pytest.fixture(scope="module")
def browser():
    """A fresh headless Chromium (the system's) with a profile of its own, driven by playwright."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium is not installed ({CHROMIUM}; scripts/setup.sh installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    wait_for_memory(2.0)  # a renderer short of memory crashes the page
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                       args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        yield context
        context.close()


@contextlib.contextmanager
def view(*run_dirs: Path):
    """``vf-rl view RUN_DIR ... --no-browser`` on a free port; yields the address it printed once the
    page answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "vf_rl.launcher.main", "view", *map(str, run_dirs),
                                "--port", str(port), "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(f"vf-rl view: http://127.0.0.1:{port}/ (2 runs"), line + process.stderr.read()
        url = line.split()[2]
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "vf-rl view did not answer"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def plotted(page, key: str) -> dict[str, tuple[list, list]]:
    """The traces of metric ``key``'s graph as plotly drew them: ``{run: (x, y)}``."""
    gid = "graph-" + "".join(c if c.isalnum() else "-" for c in key)
    page.wait_for_selector(f"#{gid} .js-plotly-plot")
    traces = page.evaluate(f"document.querySelector('#{gid} .js-plotly-plot').data.map(t => [t.name, t.x, t.y])")
    return {name: (list(x), list(y)) for name, x, y in traces}


def logged(run: Path, key: str, against: str = "step") -> tuple[list, list]:
    """What ``run``'s metrics.jsonl logged for ``key``: (steps or seconds, values)."""
    rows = records(run)
    seconds = {0: 0.0, **{r["step"]: r["timing/elapsed_s"] for r in rows if "timing/elapsed_s" in r}}
    points = [(r["step"] if against == "step" else seconds[r["step"]], r[key]) for r in rows if key in r]
    return [x for x, _ in points], [y for _, y in points]


@pytest.mark.server
def test_view_shows_both_runs_curves_config_differences_and_a_steps_rollouts(two_runs, browser, tmp_path):
    """The page of two runs in headless Chromium: every curve holds each run's logged values (against
    steps, then seconds), the config table the keys that differ, and the rollouts of the chosen step
    of the second run group by group, as recorded; the page fetches nothing from elsewhere.
    Screenshots go to $VF_RL_VIEW_SCREENSHOTS (default: the test's directory)."""
    shots = Path(os.environ.get("VF_RL_VIEW_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    low, high = two_runs
    page = browser.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    with view(low, high) as url:
        page.goto(url)
        page.wait_for_function("document.querySelector('#graph-reward .js-plotly-plot')?.data?.length === 2")
        health = sorted({k for run in two_runs for r in records(run) for k in r if k.startswith("health/")})
        for key in ["reward", "eval/reward", "entropy", "tokens/completion", "truncated/rate", *health]:
            assert plotted(page, key) == {"low-lr": logged(low, key), "high-lr": logged(high, key)}, key
        summaries = [li.text_content() for li in page.query_selector_all("#runs li")]
        assert [s.split(";")[0] for s in summaries] == [
            f"{run.name} ({run}): 2 steps, {logged(run, 'reward', 'seconds')[0][-1]:.0f} s" for run in two_runs]
        table = page.inner_text("#config-table")
        assert "trainer.args.learning_rate\t0.0001\t0.002" in table, table
        assert "trainer.args.run_name" in table and "trainer.args.batch_size" not in table
        page.screenshot(path=str(shots / "view-runs.png"), full_page=True)

        page.get_by_label("seconds of training").check()
        page.wait_for_function("document.querySelector('#graph-reward .js-plotly-plot').data[0].x[0] > 2")
        assert plotted(page, "reward") == {"low-lr": logged(low, "reward", "seconds"),
                                           "high-lr": logged(high, "reward", "seconds")}
        assert plotted(page, "eval/reward")["high-lr"] == logged(high, "eval/reward", "seconds")

        page.click("#rollout-run")
        page.get_by_role("option", name="high-lr", exact=True).click()
        page.click("#rollout-step")
        page.get_by_role("option", name="step 1", exact=True).click()
        page.wait_for_function("document.querySelector('#rollouts-title')?.innerText.startsWith('high-lr, step 1')")
        recorded = groups(read_rollouts(rollouts_path(high, 1)))
        assert page.inner_text("#rollouts-title") == f"high-lr, step 1: {BATCH_SIZE} rollouts in {len(recorded)} groups"
        shown = page.query_selector_all("#rollouts .group")
        assert len(shown) == len(recorded) == BATCH_SIZE // ROLLOUTS_PER_EXAMPLE
        for element, group in zip(shown, recorded):
            assert f"row {group[0]['row_id']}" in element.query_selector("summary").text_content()
            assert element.query_selector(".prompt").text_content() == message_text(group[0]["prompt"])
            assert element.query_selector(".answer").text_content() == group[0]["answer"]
            rows = element.query_selector_all(".rollout")
            assert [r.query_selector(".completion").text_content() for r in rows] == [
                g["completion"][0]["content"] for g in group]
            assert [r.query_selector(".reward").text_content() for r in rows] == [f"{g['reward']:.3f}" for g in group]
            assert [r.query_selector(".advantage").text_content() for r in rows] == [
                f"{g['advantage']:+.3f}" for g in group]
        shown[1].query_selector("summary").click()
        page.locator("#rollouts").screenshot(path=str(shots / "view-rollouts.png"))
    origin = url.rstrip("/")
    assert requests and all(u.startswith(origin + "/") for u in requests), [u for u in requests if origin not in u]
