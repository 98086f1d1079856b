"""The CISPO loss against a float64 reference, masking at both bounds, normalisation."""

import math

import pytest
import torch

from vf_rl.trainer.loss import cispo_loss, selective_logprobs


def reference_loss(trainer_lp, sampling_lp, adv, mask, normalizer, low, high):
    """Token by token, in float64 Python."""
    total = 0.0
    for b in range(trainer_lp.shape[0]):
        for t in range(trainer_lp.shape[1]):
            if not mask[b, t]:
                continue
            ratio = math.exp(float(trainer_lp[b, t]) - float(sampling_lp[b, t]))
            if low <= ratio <= high:
                total += -ratio * float(adv[b])
    return total / normalizer


def random_inputs(seed, B=4, T=7, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    trainer_lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    sampling_lp = trainer_lp + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    return trainer_lp, sampling_lp, adv, mask


@pytest.mark.parametrize("seed", range(5))
def test_loss_matches_float64_reference(seed):
    trainer_lp, sampling_lp, adv, mask = random_inputs(seed, spread=1.5)  # some ratios leave [1/8, 8]
    normalizer = float(mask.sum())
    loss, stats = cispo_loss(trainer_lp.float(), sampling_lp.float(), adv.float(), mask, normalizer)
    expected = reference_loss(trainer_lp, sampling_lp, adv, mask, normalizer, 0.125, 8.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert stats["tokens"].item() == mask.sum().item()


def test_masking_at_both_bounds():
    low, high = 0.5, 2.0
    log = math.log
    # ratios: exactly low (kept), just below low (dropped), exactly high (kept), just above (dropped), 1 (kept)
    ratios = [low, low * 0.99, high, high * 1.01, 1.0]
    sampling = torch.zeros(1, 5)
    trainer = torch.tensor([[log(r) for r in ratios]], requires_grad=True)
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = cispo_loss(trainer, sampling, adv, mask, 1.0, low, high)
    assert loss.item() == pytest.approx(-(low + high + 1.0), rel=1e-5)
    assert stats["masked_low"].item() == 1 and stats["masked_high"].item() == 1
    loss.backward()
    # d(-r*A)/d logp = -r*A on kept tokens, 0 on dropped ones: CISPO's stop-grad weight times grad log p
    assert trainer.grad[0].tolist() == pytest.approx([-low, 0.0, -high, 0.0, -1.0], rel=1e-5)


def test_loss_mask_excludes_tokens_even_with_extreme_ratios():
    trainer = torch.tensor([[0.0, 50.0, -50.0]])
    sampling = torch.zeros(1, 3)
    mask = torch.tensor([[True, False, False]])
    loss, stats = cispo_loss(trainer, sampling, torch.tensor([2.0]), mask, 1.0)
    assert loss.item() == pytest.approx(-2.0)
    assert stats["masked_low"].item() == 0 and stats["masked_high"].item() == 0
    assert torch.isfinite(stats["mismatch_kl_sum"])


def test_token_level_normalisation_over_global_batch():
    """Micro batches summed with the global token count equal one pass over the whole batch,
    so long sequences weigh more than short ones (token-level, not sequence-level)."""
    trainer_lp, sampling_lp, adv, mask = random_inputs(7, B=6, spread=0.2)
    normalizer = float(mask.sum())
    whole, _ = cispo_loss(trainer_lp, sampling_lp, adv, mask, normalizer)
    parts = sum(cispo_loss(trainer_lp[i:i + 2], sampling_lp[i:i + 2], adv[i:i + 2], mask[i:i + 2], normalizer)[0]
                for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-9)
    # two processes, each normalising by global/world: their mean equals the whole
    half = normalizer / 2
    rank0, _ = cispo_loss(trainer_lp[:3], sampling_lp[:3], adv[:3], mask[:3], half)
    rank1, _ = cispo_loss(trainer_lp[3:], sampling_lp[3:], adv[3:], mask[3:], half)
    assert ((rank0 + rank1) / 2).item() == pytest.approx(whole.item(), rel=1e-9)


def test_on_policy_stats():
    lp = -torch.rand(2, 5)
    loss, stats = cispo_loss(lp, lp.clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 5, dtype=torch.bool), 10.0)
    assert stats["importance_ratio_sum"].item() == pytest.approx(10.0)
    assert stats["mismatch_kl_sum"].item() == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # advantages cancel


def test_bad_normalizer():
    with pytest.raises(ValueError, match="loss_normalizer"):
        cispo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_selective_logprobs_uses_temperature(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g)
    ids = torch.randint(0, 11, (2, 3), generator=g)
    lp, entropy = selective_logprobs(logits, ids, temperature)
    probs = torch.softmax(logits.double() / temperature, -1)
    expected = torch.log(probs.gather(-1, ids[..., None]).squeeze(-1))
    assert torch.allclose(lp.double(), expected, atol=1e-6)
    assert torch.allclose(entropy.double(), -(probs * probs.log()).sum(-1), atol=1e-5)


def test_nan_sampling_logprob_means_ratio_one():
    """Trained tokens that were not sampled (environment text with mask_env_responses off)."""
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    sampling = torch.tensor([[float("nan"), -2.0]])
    loss, stats = cispo_loss(trainer, sampling, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), 2.0)
    assert loss.item() == pytest.approx(-1.0)
    assert stats["importance_ratio_sum"].item() == pytest.approx(2.0)
    loss.backward()
    assert torch.isfinite(trainer.grad).all()
