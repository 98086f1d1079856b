"""Advantages, samples, sharding and micro-batch padding."""

import math

import pytest
import torch

from vf_rl.algorithm.advantage import compute_advantages, get_advantage, group_mean, group_mean_std
from vf_rl.config.choices import builtin_functions
from vf_rl.config.rules import ConfigError
from vf_rl.env_api import Rollout, Turn
from vf_rl.orchestrator.samples import Sample, exceeds_max_seq_len, rollout_to_samples
from vf_rl.trainer.batching import micro_batches, shard


def rollouts(rewards, lengths=None):
    lengths = lengths or [1] * len(rewards)
    return [Rollout(example_id=0, prompt=[], reward=r, turns=[Turn([0], [1] * n, [0.0] * n)])
            for r, n in zip(rewards, lengths)]


def group_advantages(rewards, group_size, fn=group_mean):
    return compute_advantages(fn, rollouts(rewards), group_size)


def test_group_mean_subtracts_the_group_mean_without_std():
    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    assert group_advantages(rewards, 4) == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    assert group_advantages([2.0, 4.0], 2) == pytest.approx([-1.0, 1.0])  # not divided by std (1.0)
    assert group_advantages([0.0, 10.0], 2) == pytest.approx([-5.0, 5.0])


def test_group_mean_std_divides_by_the_population_std():
    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 4)  # 0.4330
    expected = [0.75 / (std + 1e-4)] + [-0.25 / (std + 1e-4)] * 3 + [0.0] * 4  # equal rewards: 0, not NaN
    assert group_advantages(rewards, 4, group_mean_std) == pytest.approx(expected, rel=1e-5)
    assert group_advantages([0.0, 10.0], 2, group_mean_std) == pytest.approx([-1.0, 1.0], rel=1e-4)


def test_advantages_reject_ragged_groups_and_wrong_shapes():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages([1.0] * 6, 4)
    with pytest.raises(ValueError, match=r"returned shape \(4,\), expected \(2, 2\)"):
        group_advantages([1.0] * 4, 2, lambda inputs: inputs.rewards.flatten())


def test_advantage_inputs_carry_lengths_and_resolve_by_name():
    seen = {}

    def length_penalty(inputs):
        seen["tokens"] = inputs.completion_tokens.tolist()
        return group_mean(inputs) - 0.01 * inputs.completion_tokens

    advantages = compute_advantages(length_penalty, rollouts([1.0, 0.0], lengths=[3, 5]), 2)
    assert seen["tokens"] == [[3, 5]] and advantages == pytest.approx([0.5 - 0.03, -0.5 - 0.05])
    assert set(builtin_functions("advantage")) == {"group_mean", "group_mean_std"}
    assert get_advantage("group_mean_std") is group_mean_std
    assert get_advantage("vf_rl.algorithm.advantage:group_mean") is group_mean
    with pytest.raises(ConfigError, match="advantage_type: expected one of group_mean, group_mean_std"):
        get_advantage("std")


def test_single_turn_sample_masks_prompt_and_cuts_to_max_seq_len():
    (s,) = rollout_to_samples([Turn([1, 2, 3], [4, 5], [-0.5, -0.25])], 0.3, max_seq_len=10)
    assert s.input_ids == [1, 2, 3, 4, 5]
    assert s.loss_mask == [0, 0, 0, 1, 1]
    assert s.sampling_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert s.advantage == 0.3
    (cut,) = rollout_to_samples([Turn([1, 2, 3], [4, 5], [-0.5, -0.25])], 0.3, max_seq_len=4)
    assert cut.input_ids == [1, 2, 3, 4] and cut.loss_mask == [0, 0, 0, 1]
    assert rollout_to_samples([Turn([1, 2, 3], [4], [-1.0])], 0.3, max_seq_len=3) == []


def test_turns_that_extend_each_other_merge_into_one_sample():
    turns = [Turn([1, 2], [3, 4], [-0.1, -0.2]),          # model turn 1
             Turn([1, 2, 3, 4, 9, 9], [5], [-0.3]),       # prompt = turn 1 + env reply [9, 9]
             Turn([1, 2, 3, 4, 9, 9, 5, 8], [6, 7], [-0.4, -0.5])]
    (s,) = rollout_to_samples(turns, 1.0, max_seq_len=100)
    assert s.input_ids == [1, 2, 3, 4, 9, 9, 5, 8, 6, 7]
    assert s.loss_mask == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert s.sampling_logprobs == [0, 0, -0.1, -0.2, 0, 0, -0.3, 0, -0.4, -0.5]
    (unmasked,) = rollout_to_samples(turns, 1.0, max_seq_len=100, mask_env_responses=False)
    assert unmasked.loss_mask == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert math.isnan(unmasked.sampling_logprobs[4]) and unmasked.sampling_logprobs[6] == -0.3


def test_a_template_that_rewrites_history_keeps_separate_samples():
    """E.g. Qwen3 dropping <think> blocks of earlier turns: turn 2's prompt no longer starts
    with turn 1's tokens, so each turn is its own sample."""
    turns = [Turn([1, 2], [50, 51, 3], [-0.1, -0.2, -0.3]),  # 50, 51 = "<think>..."
             Turn([1, 2, 3, 9], [4], [-0.4])]                 # history re-rendered without 50, 51
    first, second = rollout_to_samples(turns, -0.5, max_seq_len=100)
    assert first.input_ids == [1, 2, 50, 51, 3] and first.loss_mask == [0, 0, 1, 1, 1]
    assert second.input_ids == [1, 2, 3, 9, 4] and second.loss_mask == [0, 0, 0, 0, 1]
    assert first.advantage == second.advantage == -0.5


def test_shard_pads_so_every_process_gets_whole_micro_batches():
    samples = [Sample([i], [1], [0.0], float(i)) for i in range(5)]
    r0 = shard(samples, world_size=2, rank=0, micro_batch_size=2)
    r1 = shard(samples, world_size=2, rank=1, micro_batch_size=2)
    assert len(r0) == len(r1) == 4
    assert [s.advantage for s in r0[:3]] == [0.0, 2.0, 4.0]
    assert [s.advantage for s in r1[:2]] == [1.0, 3.0]
    assert sum(r1[2].loss_mask + r1[3].loss_mask + r0[3].loss_mask) == 0  # fillers carry no loss


def test_micro_batches_right_pad():
    samples = [Sample([5, 6, 7], [0, 1, 1], [0, -1, -2], 1.0), Sample([8, 9], [0, 1], [0, -3], -1.0),
               Sample([1, 2, 3, 4], [0, 0, 1, 1], [0, 0, -1, -1], 0.5)]
    batches = micro_batches(samples, micro_batch_size=2, pad_token_id=0)
    assert len(batches) == 2
    first = batches[0]
    assert first["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert first["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert first["loss_mask"].tolist() == [[False, True, True], [False, True, False]]
    assert first["sampling_logprobs"].dtype == torch.float32
    assert first["advantages"].tolist() == [1.0, -1.0]
    assert batches[1]["input_ids"].shape == (1, 4)


@pytest.mark.parametrize("turns", [
    [Turn([1, 2, 3], [4, 5], [-0.5, -0.25])],
    [Turn([1, 2], [3, 4], [-0.1, -0.2]), Turn([1, 2, 3, 4, 9, 9], [5], [-0.3])],  # merged into one sample
    [Turn([1, 2], [3, 4], [-0.1, -0.2]), Turn([1, 7, 9], [5, 6, 8], [-0.3] * 3)],  # a rewritten history
])
def test_exceeds_max_seq_len_is_exactly_when_samples_are_cut(turns):
    """A rollout is marked truncated at max_seq_len exactly when rollout_to_samples shortens it."""
    full = sum(len(s.input_ids) for s in rollout_to_samples(turns, 0.0, max_seq_len=10 ** 6))
    for limit in range(1, 12):
        kept = sum(len(s.input_ids) for s in rollout_to_samples(turns, 0.0, max_seq_len=limit))
        assert exceeds_max_seq_len(turns, limit) == (kept < full), limit


def test_sample_table_prints_to_the_current_stdout(monkeypatch):
    """The sample table goes to sys.stdout as it is when printed: a stream replaced after import
    (a notebook's, a test's capture) gets it, and a closed earlier one is not written to."""
    import io

    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.display import sample_table

    batch = Batch(step=0, samples=[], row_ids=[7],
                  rollouts=[Rollout(example_id=7, prompt=[{"role": "user", "content": "Reverse: abc"}],
                                    completion=[{"role": "assistant", "content": "cba"}], reward=1.0)])
    for _ in range(2):
        stream = io.StringIO()
        monkeypatch.setattr("sys.stdout", stream)
        sample_table(batch, step=1)
        assert "Step 1 samples" in stream.getvalue() and "cba" in stream.getvalue() and "1.000" in stream.getvalue()
        stream.close()
