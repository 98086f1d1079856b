"""The losses against float64 hand computations, masking and clipping at both bounds,
normalisation, the statistics convention, and resolving a loss by name."""

import math
from types import SimpleNamespace

import pytest
import torch
from plain_logprobs import policy_logprobs

from vf_rl.algorithm.loss import (
    BatchTotals,
    LossInputs,
    LossOutput,
    bnpo_loss,
    cispo_loss,
    dapo_loss,
    dr_grpo_loss,
    get_loss,
    grpo_loss,
    gspo_loss,
    micro_batch_loss,
)
from vf_rl.config.choices import builtin_functions
from vf_rl.config.rules import ConfigError
from vf_rl.trainer.speed.logprobs import selective_logprobs

ARGS = SimpleNamespace(mask_ratio_low=0.125, mask_ratio_high=8.0, epsilon_low=0.2, epsilon_high=0.28, beta=0.0,
                       max_tokens=None, max_seq_len=256)


def run_loss(fn, trainer_lp, sampling_lp, adv, mask, normalizer, **args):
    """``fn`` on plain tensors, masked and normalised as the trainer does: returns ``(loss, stats)``."""
    inputs = LossInputs(trainer_lp, sampling_lp, adv, mask.bool(), torch.zeros_like(trainer_lp))
    return micro_batch_loss(fn, inputs, SimpleNamespace(**{**vars(ARGS), **args}), normalizer)


def cispo(trainer_lp, sampling_lp, adv, mask, normalizer, low=0.125, high=8.0):
    return run_loss(cispo_loss, trainer_lp, sampling_lp, adv, mask, normalizer, mask_ratio_low=low,
                    mask_ratio_high=high)


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
    loss, stats = cispo(trainer_lp.float(), sampling_lp.float(), adv.float(), mask, normalizer)
    expected = reference_loss(trainer_lp, sampling_lp, adv, mask, normalizer, 0.125, 8.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert stats["importance_ratio"].item() == pytest.approx(
        sum(math.exp(float(trainer_lp[b, t]) - float(sampling_lp[b, t]))
            for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]), rel=1e-5)


def test_masking_at_both_bounds():
    low, high = 0.5, 2.0
    log = math.log
    # ratios: exactly low (kept), just below low (dropped), exactly high (kept), just above (dropped), 1 (kept)
    ratios = [low, low * 0.99, high, high * 1.01, 1.0]
    sampling = torch.zeros(1, 5)
    trainer = torch.tensor([[log(r) for r in ratios]], requires_grad=True)
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = cispo(trainer, sampling, adv, mask, 1.0, low, high)
    assert loss.item() == pytest.approx(-(low + high + 1.0), rel=1e-5)
    assert stats["masked/low_fraction"].item() == 1 and stats["masked/high_fraction"].item() == 1
    assert stats["tokens/masked_fraction"].item() == 2
    loss.backward()
    # d(-r*A)/d logp = -r*A on kept tokens, 0 on dropped ones: CISPO's stop-grad weight times grad log p
    assert trainer.grad[0].tolist() == pytest.approx([-low, 0.0, -high, 0.0, -1.0], rel=1e-5)


def test_loss_mask_excludes_tokens_even_with_extreme_ratios():
    trainer = torch.tensor([[0.0, 50.0, -50.0]])
    sampling = torch.zeros(1, 3)
    mask = torch.tensor([[True, False, False]])
    loss, stats = cispo(trainer, sampling, torch.tensor([2.0]), mask, 1.0)
    assert loss.item() == pytest.approx(-2.0)
    assert stats["masked/low_fraction"].item() == 0 and stats["masked/high_fraction"].item() == 0
    assert torch.isfinite(stats["mismatch_kl"]) and stats["logprob_diff/max"].item() == 0.0


def test_token_level_normalisation_over_global_batch():
    """Micro batches summed with the global token count equal one pass over the whole batch,
    so long sequences weigh more than short ones (token-level, not sequence-level)."""
    trainer_lp, sampling_lp, adv, mask = random_inputs(7, B=6, spread=0.2)
    normalizer = float(mask.sum())
    whole, _ = cispo(trainer_lp, sampling_lp, adv, mask, normalizer)
    parts = sum(cispo(trainer_lp[i:i + 2], sampling_lp[i:i + 2], adv[i:i + 2], mask[i:i + 2], normalizer)[0]
                for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-9)
    # two processes, each normalising by global/world: their mean equals the whole
    half = normalizer / 2
    rank0, _ = cispo(trainer_lp[:3], sampling_lp[:3], adv[:3], mask[:3], half)
    rank1, _ = cispo(trainer_lp[3:], sampling_lp[3:], adv[3:], mask[3:], half)
    assert ((rank0 + rank1) / 2).item() == pytest.approx(whole.item(), rel=1e-9)


def test_on_policy_stats():
    lp = -torch.rand(2, 5)
    loss, stats = cispo(lp, lp.clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 5, dtype=torch.bool), 10.0)
    assert stats["importance_ratio"].item() == pytest.approx(10.0)
    assert stats["mismatch_kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # advantages cancel


@pytest.mark.parametrize("fn", [cispo_loss, dapo_loss])
def test_bad_normalizer(fn):
    with pytest.raises(ValueError, match="loss_normalizer"):
        run_loss(fn, torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0)


def test_a_reduced_loss_is_refused():
    """A loss that returns a scalar (already masked and normalised) would be normalised twice:
    refused with its name and the expected shape."""
    def reduced(inputs, args):
        return cispo_loss(inputs, args).__class__(cispo_loss(inputs, args).per_token.sum(), {})

    with pytest.raises(ValueError, match=r"reduced: LossOutput.per_token must be \[B, T\] = \(1, 2\)"):
        run_loss(reduced, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), 2.0)


def dapo_reference(trainer_lp, sampling_lp, adv, mask, normalizer, eps_low, eps_high):
    """PPO's clipped surrogate with asymmetric clip, token by token in float64 Python."""
    total = 0.0
    for b in range(trainer_lp.shape[0]):
        for t in range(trainer_lp.shape[1]):
            if mask[b, t]:
                ratio = math.exp(float(trainer_lp[b, t]) - float(sampling_lp[b, t]))
                clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
                total += -min(ratio * float(adv[b]), clipped * float(adv[b]))
    return total / normalizer


@pytest.mark.parametrize("seed", range(4))
def test_dapo_matches_float64_reference(seed):
    trainer_lp, sampling_lp, adv, mask = random_inputs(seed, spread=0.4)  # many ratios outside the clip range
    normalizer = float(mask.sum())
    loss, stats = run_loss(dapo_loss, trainer_lp.float(), sampling_lp.float(), adv.float(), mask, normalizer,
                           epsilon_low=0.2, epsilon_high=0.28)
    expected = dapo_reference(trainer_lp, sampling_lp, adv, mask, normalizer, 0.2, 0.28)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert stats["clipped/low_fraction"].item() + stats["clipped/high_fraction"].item() > 0


def test_dapo_gradient_is_zero_exactly_where_the_clip_binds():
    eps_low, eps_high = 0.2, 0.28
    ratios = [0.7, 0.9, 1.2, 1.4, 0.7, 1.4]  # A > 0 for the first four, A < 0 for the last two
    adv = torch.tensor([1.0, -1.0])
    trainer = torch.tensor([[math.log(r) for r in ratios[:4]], [math.log(ratios[4]), math.log(ratios[5]), 0, 0]],
                           requires_grad=True)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    loss, stats = run_loss(dapo_loss, trainer, torch.zeros(2, 4), adv, mask, 1.0, epsilon_low=eps_low,
                           epsilon_high=eps_high)
    loss.backward()
    # A > 0: only r > 1 + eps_high is clipped (1.4); A < 0: only r < 1 - eps_low is clipped (0.7)
    assert trainer.grad[0].tolist() == pytest.approx([-0.7, -0.9, -1.2, 0.0], rel=1e-5)
    assert trainer.grad[1].tolist() == pytest.approx([0.0, 1.4, 0.0, 0.0], rel=1e-5)
    assert stats["clipped/high_fraction"].item() == 1 and stats["clipped/low_fraction"].item() == 1


def test_losses_resolve_by_name_and_module_path():
    builtins = {"cispo": cispo_loss, "dapo": dapo_loss, "grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "bnpo": bnpo_loss,
                "gspo": gspo_loss}
    assert {name: get_loss(name) for name in builtins} == builtins
    assert set(builtin_functions("loss")) == set(builtins)  # each registered by its option
    assert get_loss("vf_rl.algorithm.loss:dapo_loss") is dapo_loss
    with pytest.raises(ConfigError, match="loss_type: expected one of cispo, dapo, grpo, dr_grpo, bnpo, gspo"):
        get_loss("ppo")
    with pytest.raises(ConfigError, match="loss_type: cannot import module 'no_such_module'"):
        get_loss("no_such_module:my_loss")
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        get_loss("vf_rl.algorithm.loss:nope")


def surrogate(ratio, adv, eps_low, eps_high):
    return -min(ratio * adv, min(max(ratio, 1 - eps_low), 1 + eps_high) * adv)


def trl_reference(name, trainer_lp, sampling_lp, ref_lp, adv, mask, shards, eps_low, eps_high, beta, length):
    """TRL's ``_compute_loss`` aggregations (trl/trainer/grpo_trainer.py), in float64 Python: each
    token's ``surrogate + beta * k3`` (GSPO: the surrogate of the sequence's ratio), aggregated per
    ``name``; ``shards``: each trainer process's rows (bnpo's local batches)."""
    def k3(b, t):
        d = float(ref_lp[b, t]) - float(trainer_lp[b, t])
        return math.exp(d) - d - 1

    def log_r(b, t):
        return float(trainer_lp[b, t]) - float(sampling_lp[b, t])

    tokens = {b: [t for t in range(mask.shape[1]) if mask[b, t]] for b in range(mask.shape[0])}
    tokens = {b: ts for b, ts in tokens.items() if ts}  # the samples with loss tokens
    if name == "gspo":
        seq = {b: math.exp(sum(log_r(b, t) for t in ts) / len(ts)) for b, ts in tokens.items()}
        loss = {(b, t): surrogate(seq[b], float(adv[b]), eps_low, eps_high) + beta * k3(b, t)
                for b, ts in tokens.items() for t in ts}
    else:
        loss = {(b, t): surrogate(math.exp(log_r(b, t)), float(adv[b]), eps_low, eps_high) + beta * k3(b, t)
                for b, ts in tokens.items() for t in ts}
    if name in ("grpo", "gspo"):  # the mean over samples of each sample's token mean
        return sum(sum(loss[b, t] for t in ts) / len(ts) for b, ts in tokens.items()) / len(tokens)
    if name == "dr_grpo":  # summed, over samples x max_completion_length
        return sum(loss.values()) / (len(tokens) * length)
    if name == "bnpo":  # each process's token mean, averaged over processes (DDP)
        means = [sum(v for (b, _), v in loss.items() if b in rows) / sum(len(tokens.get(b, [])) for b in rows)
                 for rows in shards]
        return sum(means) / len(means)
    raise ValueError(name)


TRL_LOSSES = {"grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "bnpo": bnpo_loss, "gspo": gspo_loss}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(TRL_LOSSES))
def test_trl_losses_match_their_formulas_over_micro_batches_and_processes(name, seed):
    """Six samples (one without loss tokens) on two trainer processes, each in two micro batches,
    with a KL term: summing each process's micro batches (the trainer's N / P normaliser) and
    averaging the processes (DDP) gives TRL's aggregation of each loss type, computed by hand."""
    trainer_lp, sampling_lp, adv, mask = random_inputs(seed, B=6, T=7, spread=0.3)
    mask[4] = False
    ref_lp = trainer_lp + torch.randn(trainer_lp.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    args = SimpleNamespace(**{**vars(ARGS), "beta": 0.1, "max_tokens": 10, "epsilon_high": 0.2})
    shards, micro = [[0, 1, 2], [3, 4, 5]], [[[0, 1], [2]], [[3], [4, 5]]]
    n = int(mask.sum())
    totals = [BatchTotals(n, 5, int(mask[rows].sum()), 2) for rows in shards]
    process_losses = []
    for p in range(2):
        loss = 0.0
        for rows in micro[p]:
            inputs = LossInputs(trainer_lp[rows].float(), sampling_lp[rows].float(), adv[rows].float(), mask[rows],
                                torch.zeros(len(rows), 7), ref_lp[rows].float(), totals[p])
            loss = loss + micro_batch_loss(TRL_LOSSES[name], inputs, args, n / 2)[0]
        process_losses.append(loss)
    expected = trl_reference(name, trainer_lp, sampling_lp, ref_lp, adv, mask, shards, 0.2, 0.2, 0.1, 10)
    assert (sum(process_losses) / 2).item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # the micro batch alone (no totals) is a whole batch on one process
    alone = LossInputs(trainer_lp.float(), sampling_lp.float(), adv.float(), mask, torch.zeros(6, 7), ref_lp.float())
    expected = trl_reference(name, trainer_lp, sampling_lp, ref_lp, adv, mask, [range(6)], 0.2, 0.2, 0.1, 10)
    assert micro_batch_loss(TRL_LOSSES[name], alone, args, n)[0].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_dr_grpo_constant_is_max_tokens_else_max_seq_len():
    trainer_lp, sampling_lp, adv, mask = random_inputs(3)
    inputs = LossInputs(trainer_lp, sampling_lp, adv, mask, torch.zeros_like(trainer_lp))
    losses = [micro_batch_loss(dr_grpo_loss, inputs, SimpleNamespace(**{**vars(ARGS), **extra}), 1.0)[0].item()
              for extra in ({"max_tokens": None, "max_seq_len": 64}, {"max_tokens": 64, "max_seq_len": 256},
                            {"max_tokens": 32, "max_seq_len": 256})]
    assert losses[0] == pytest.approx(losses[1], rel=1e-12) and losses[2] == pytest.approx(2 * losses[1], rel=1e-12)


def test_gspo_gradient_is_the_sequence_ratios():
    """Two samples: s_i = exp(mean log r) with its gradient through every token, d loss / d logp_it
    = -A_i s_i / (S |o_i|) where s_i is inside the clip range for its advantage's sign, else 0."""
    log_r = [[0.1, -0.3, 0.05], [0.4, 0.2, 0.0]]
    trainer = torch.tensor(log_r, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([1.0, 2.0])
    s0, s1 = math.exp((0.1 - 0.3 + 0.05) / 3), math.exp((0.4 + 0.2) / 2)  # 0.951 (inside), 1.350 (above 1.28)
    inputs = LossInputs(trainer, torch.zeros(2, 3), adv, mask, torch.zeros(2, 3))
    loss, stats = micro_batch_loss(gspo_loss, inputs, ARGS, 5.0)
    assert loss.item() == pytest.approx((-s0 * 1.0 - 1.28 * 2.0) / 2, rel=1e-6)  # A > 0 above the range: clipped
    loss.backward()
    assert trainer.grad[0].tolist() == pytest.approx([-s0 / (2 * 3)] * 3, rel=1e-5)
    assert trainer.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert stats["sequence_ratio"].item() == pytest.approx(3 * s0 + 2 * s1, rel=1e-6)
    assert stats["clipped/high_fraction"].item() == 2 and stats["clipped/low_fraction"].item() == 0


def test_a_weight_that_does_not_broadcast_is_refused():
    def wrong(inputs, args):
        return LossOutput(dapo_loss(inputs, args).per_token, {}, torch.ones(3))

    with pytest.raises(ValueError, match=r"wrong: LossOutput.weight must broadcast to \[B, T\] = \(1, 2\), got shape \(3,\)"):
        run_loss(wrong, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), 2.0)


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


@pytest.mark.parametrize("temperature, dtype", [(1.0, torch.float32), (0.7, torch.float32), (1.0, torch.bfloat16)])
def test_selective_logprobs_gradient_matches_log_softmax(temperature, dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 5, 17, generator=g) * 3).to(dtype).requires_grad_()
    ids = torch.randint(0, 17, (3, 5), generator=g)
    weights = torch.randn(3, 5, generator=g, dtype=torch.float64)
    lp, _ = selective_logprobs(logits, ids, temperature)
    (lp.double() * weights).sum().backward()
    reference = logits.detach().double().requires_grad_()
    expected = torch.log_softmax(reference / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
    (expected * weights).sum().backward()
    assert lp.dtype == torch.float32
    assert torch.allclose(lp.double(), expected, atol=1e-5)
    assert torch.allclose(logits.grad.double(), reference.grad, atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_policy_logprobs_runs_the_lm_head_on_completions_only(model_dir):
    """Real SmolLM2, a right-padded micro batch with different prompt lengths: the log-probs and
    gradients with ``logits_to_keep`` equal those of a forward over every position."""
    from transformers import AutoModelForCausalLM

    from vf_rl.orchestrator.samples import Sample
    from vf_rl.trainer.batching import first_trained_position, micro_batches

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    samples = []
    for prompt_len, completion_len in ((9, 6), (5, 4), (12, 3)):
        ids = torch.randint(10, 1000, (prompt_len + completion_len,), generator=g).tolist()
        samples.append(Sample(input_ids=ids, loss_mask=[0] * prompt_len + [1] * completion_len,
                              sampling_logprobs=[0.0] * len(ids), advantage=1.0))
    mb = micro_batches(samples, 3, pad_token_id=0)[0]
    heads = []
    for keep in (True, False):
        model.zero_grad()
        start = first_trained_position(mb["loss_mask"])
        assert start == 5  # the shortest prompt
        lp, entropy = policy_logprobs(model, mb, start, 0.9, logits_to_keep=keep)
        lp[mb["loss_mask"][:, start:]].sum().backward()
        heads.append((lp.detach(), entropy, model.model.embed_tokens.weight.grad.clone()))
    (lp_keep, ent_keep, grad_keep), (lp_all, ent_all, grad_all) = heads
    with torch.no_grad():
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits.double() / 0.9
        full = torch.log_softmax(logits[:, :-1], -1).gather(-1, mb["input_ids"][:, 1:, None]).squeeze(-1)
    assert lp_keep.shape == (3, mb["input_ids"].shape[1] - 5)
    assert torch.allclose(lp_keep.double(), full[:, 4:], atol=1e-4)
    assert torch.allclose(lp_keep, lp_all, atol=1e-5) and torch.allclose(ent_keep, ent_all, atol=1e-5)
    assert torch.allclose(grad_keep, grad_all, atol=1e-6)


def test_nan_sampling_logprob_means_ratio_one():
    """Trained tokens that were not sampled (environment text with mask_env_responses off)."""
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    sampling = torch.tensor([[float("nan"), -2.0]])
    loss, stats = cispo(trainer, sampling, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), 2.0)
    assert loss.item() == pytest.approx(-1.0)
    assert stats["importance_ratio"].item() == pytest.approx(2.0)
    loss.backward()
    assert torch.isfinite(trainer.grad).all()


def test_training_step_ignores_padding_micro_batches(model_dir, tmp_path):
    """A real RLTrainer on SmolLM2: a batch whose last micro batch holds only the one-token
    padding samples that ``shard`` adds gives the same loss and gradients as the batch without
    them (several processes pad their shards this way)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.orchestrator.samples import Sample

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, batch_size=2, rollouts_per_example=2, micro_batch_size=2,
                    max_steps=1, report_to=[])
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t")
    g = torch.Generator().manual_seed(0)
    real = []
    for prompt_len, completion_len, advantage in ((6, 4, 1.0), (4, 5, -1.0)):
        ids = torch.randint(10, 1000, (prompt_len + completion_len,), generator=g)
        with torch.no_grad():  # sampling log-probs near the model's own, so the ratios stay unmasked
            own, _ = selective_logprobs(model(input_ids=ids[None]).logits[:, :-1], ids[None, 1:])
        sampling = [0.0] + (own[0] + 0.1 * torch.randn(len(ids) - 1, generator=g)).tolist()
        real.append(Sample(ids.tolist(), [0] * prompt_len + [1] * completion_len, sampling, advantage))
    padding = [Sample([0], [0], [0.0], 0.0)] * 2
    results = []
    for samples in (real, real + padding):
        trainer.model.zero_grad()
        loss, stats = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[], metrics={}))
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((float(loss), stats, grad))
    (loss_a, stats_a, grad_a), (loss_b, stats_b, grad_b) = results
    # float32; the padding changes how the chunked log-prob sums are grouped, not what they sum
    assert loss_a == pytest.approx(loss_b, rel=1e-4) and loss_a != 0.0
    assert stats_a["tokens/loss"] == stats_b["tokens/loss"] == 9
    assert stats_a["logprob_diff/max"] == pytest.approx(stats_b["logprob_diff/max"], rel=1e-4) and stats_a["logprob_diff/max"] > 0
    # relative L2 (as test_packing's packed-vs-padded check): element-wise, 20 of 4.9M entries differ by up to
    # 9e-7 beyond rtol 1e-4 with torch 2.13 / transformers 5.19, where sums cancel; the whole differs by 2.8e-5
    assert grad_a.abs().sum() > 0 and float((grad_a - grad_b).norm() / grad_a.norm()) < 1e-4
