"""Environment packages that third parties publish on PyPI for ``verifiers``, installed as their
READMEs say (pinned in the ``test-envs`` extra), named in ``[env] id`` the way a user names them,
and trained through ``vf-rl @ config.toml`` and evaluated with ``vf-eval``: no wrapper of ours.

- alkahest 3.12.0, ``alkahest.rl.envs.integration``: single-turn symbolic integration; reward
  in [-1, 1] from ``reward_fn(completion, f_str, is_elementary)``, which reads the dataset's own
  columns.
- sharpearena 0.31.0, ``sharpearena.verifiers_env``: a multi-turn trading episode (one market
  bar per turn, XML actions), reward functions on the episode's realised return and mandate.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import free_port, run_vf_eval, write_cpu_config

pytestmark = pytest.mark.classic  # both packages are written for verifiers' classic API

PUBLISHED = [
    pytest.param("alkahest.rl.envs.integration", {"n_train": 64, "n_eval": 16},
                 {"reward/reward_fn"}, (-1.0, 1.0), id="alkahest-single-turn"),
    pytest.param("sharpearena.verifiers_env", {"max_episode_bars": 2, "n_windows": 4},
                 {"reward/realized_return_reward", "reward/mandate_reward", "reward/format_reward"}, (-2.0, 2.0),
                 id="sharpearena-multi-turn"),
]

# CI trains the single-turn package; the multi-turn one is in the slow tier (`scripts/test.sh -m slow`)
TRAINED = [PUBLISHED[0], pytest.param(*PUBLISHED[1].values, id=PUBLISHED[1].id, marks=pytest.mark.slow)]


@pytest.mark.server
@pytest.mark.parametrize("env_id,env_args,metrics,bounds", TRAINED)
def test_published_environment_trains_through_vf_rl(model_dir, tmp_path, env_id, env_args, metrics, bounds):
    """Two steps of ``vf-rl @ config.toml`` (real tmux, its own server): the package's own reward
    functions are in the metrics, and the loss saw its tokens."""
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "published.toml", model_dir, out, free_port(), env_id=env_id,
                              env_args=env_args, inference_args={"enforce_eager": True, "max_model_len": 1024},
                              run_name="published", micro_batch_size=8, rollouts_per_example=4, batch_size=8,
                              max_steps=2, max_tokens=32, max_seq_len=1024, save_steps=50)
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s",
                             f"vf-rl-published-{free_port()}", "--wait"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path)
    log = out / "logs" / "trainer.log"
    assert result.returncode == 0, (result.stdout, result.stderr, log.read_text()[-3000:] if log.exists() else "")
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    low, high = bounds
    for r in steps:
        assert metrics <= set(r), sorted(r)
        assert low <= r["reward"] <= high and r["tokens/loss"] > 0, r
        assert r.get("errors/rate", 0.0) < 1.0, r


@pytest.mark.server
@pytest.mark.parametrize("env_id,env_args,metrics,bounds", PUBLISHED)
def test_published_environment_evaluates_with_vf_eval(server, tmp_path, env_id, env_args, metrics, bounds):
    out = tmp_path / "eval.jsonl"
    result = run_vf_eval(server, env_id, env_args, out, max_tokens=32, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert all(m in result.stdout for m in metrics), result.stdout[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    low, high = bounds
    assert len(records) == 4 and all(low <= r["reward"] <= high for r in records), records
