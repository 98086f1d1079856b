"""Padding-free packing, the shared-prompt forward and chunked log-probs against the plain
(padded, per-sample, full-logits) computations, on real SmolLM2 in float32 on the CPU."""

import contextlib
import dataclasses

import pytest
import torch
from plain_logprobs import policy_logprobs

from vf_rl.orchestrator.samples import Sample
from vf_rl.trainer.batching import first_trained_position, micro_batches
from vf_rl.trainer.speed.attention import ATTN_IMPLEMENTATION, register_attention
from vf_rl.trainer.speed.logprobs import (
    chunked_logprobs,
    packed_policy_logprobs,
    padded_policy_logprobs,
    selective_logprobs,
)
from vf_rl.trainer.speed.packing import (
    bucket,
    default_token_budget,
    first_trained,
    micro_batches_to,
    pack_for_rank,
    pack_samples,
    packed_micro_batch,
    pad_to_buckets,
    padded_micro_batch,
    plan_micro_batches,
    should_pack,
)


def group_samples(spec, seed=0, vocab=(10, 1000)):
    """Samples of groups sharing a prompt: ``spec`` = [(prompt_len, [completion_len, ...]), ...]."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for group, (prompt_len, completions) in enumerate(spec):
        prompt = torch.randint(*vocab, (prompt_len,), generator=g).tolist()
        for c in completions:
            ids = prompt + torch.randint(*vocab, (c,), generator=g).tolist()
            samples.append(Sample(ids, [0] * prompt_len + [1] * c, [0.0] * len(ids),
                                  float(torch.randn((), generator=g)), group=group, prompt_len=prompt_len))
    return samples


def test_pack_samples_fills_the_token_budget_in_order():
    samples = group_samples([(5, [3, 4, 2]), (6, [1])])  # lengths 8, 9, 7, 7
    assert [[len(s.input_ids) for s in mb] for mb in pack_samples(samples, 17)] == [[8, 9], [7, 7]]
    # sharing: 8 + 4 + 2 = 14 for the first group, then the second group's 7 does not fit
    assert [len(mb) for mb in pack_samples(samples, 17, share_prompts=True)] == [3, 1]
    assert [len(mb) for mb in pack_samples(samples, 3)] == [1, 1, 1, 1]  # each longer than the budget: alone
    assert [len(mb) for mb in pack_samples(samples, 100, share_prompts=True, max_samples=3)] == [3, 1]
    with pytest.raises(ValueError, match="micro_batch_tokens must be positive"):
        pack_samples(samples, 0)


def test_pack_for_rank_gives_every_process_the_same_number_of_micro_batches():
    samples = group_samples([(5, [30, 1, 1, 1])])  # rank 0 gets the long sample and one short one
    r0, r1 = (pack_for_rank(samples, 2, rank, token_budget=36) for rank in (0, 1))
    assert len(r0) == len(r1) == 2
    assert [len(s.input_ids) for s in r1[1]] == [1] and not any(r1[1][0].loss_mask)  # an empty filler


def test_shared_prompt_needs_the_same_prompt_tokens():
    a, b = group_samples([(5, [3, 4])])
    b.input_ids[0] += 1  # same group id, different prompt: no sharing
    assert packed_micro_batch([a, b], share_prompts=True).tokens == len(a.input_ids) + len(b.input_ids)
    b.input_ids[0] -= 1
    assert packed_micro_batch([a, b], share_prompts=True).tokens == len(a.input_ids) + 4


def test_keys_are_gathered_only_for_samples_of_groups():
    """With ``share_prompts`` a packed micro batch of grouped samples gathers its keys, even where
    none shares a prompt (one form for compiled code: the identity), and one of samples without a
    group (nothing can share) does not: its keys are the row itself."""
    grouped = group_samples([(6, [8]), (9, [3]), (4, [5])])  # three groups of one
    mb = packed_micro_batch(grouped, share_prompts=True)
    assert torch.equal(mb.layout.key_index, torch.arange(mb.input_ids.shape[1]))
    for s in grouped:
        s.group = -1
    mb = packed_micro_batch(grouped, share_prompts=True)
    assert mb.layout.key_index is None and torch.equal(mb.layout.cu_k, mb.layout.cu_q)
    assert packed_micro_batch(group_samples([(6, [8, 2])]), share_prompts=False).layout.key_index is None


def test_plan_packs_only_where_it_saves_work():
    """Equal lengths with distinct prompts run padded; shared prompts or ragged lengths run
    packed; the default budget is micro_batch_size x the batch's mean sample length."""
    fixed = group_samples([(8, [8]), (8, [8]), (8, [8]), (8, [8])])  # 4 groups of one: nothing to share
    for s in fixed:
        s.group = -1
    assert default_token_budget(fixed, 2) == 32
    plan = plan_micro_batches(fixed, 1, 0, 2, None, True, pad_token_id=0)
    assert len(plan) == 2 and not any(mb.packed for mb in plan)  # padded: the plain kernel
    assert all(mb.attention_mask is None and mb.tokens == 32 for mb in plan)  # no padding: no mask
    assert plan[0].loss_mask.shape == (2, 8) and plan[0].keep == 9
    shared = group_samples([(8, [8, 8, 8, 8])])  # one prompt: packing forwards 8 + 4 * 8 = 40 of 64
    assert should_pack(shared, share_prompts=True) and not should_pack(shared, share_prompts=False)
    plan = plan_micro_batches(shared, 1, 0, 2, None, True, pad_token_id=0)  # budget 32: 8 + 3 * 8, then 16
    assert [mb.packed for mb in plan] == [True, False] and [mb.tokens for mb in plan] == [32, 16]
    ragged = group_samples([(4, [20]), (4, [2])])  # padded 2 x 24 = 48 tokens, packed 30
    assert should_pack(ragged) and plan_micro_batches(ragged, 1, 0, 2, None, False, 0)[0].packed
    assert not should_pack(group_samples([(4, [20]), (4, [18])]))  # padding 2 of 48: under 10%
    assert len(plan_micro_batches(ragged, 1, 0, 1, 24, False, 0)) == 2  # micro_batch_tokens overrides


def test_micro_batches_move_in_one_buffer_per_dtype():
    """Every tensor of a plan's micro batches (their layouts' too) arrives with its values, shape and
    dtype, each dtype's tensors as 16-byte aligned parts of one buffer (one copy per dtype to a GPU), each
    at storage offset 0 (a compiled layer's graphs then hold for every micro batch: packing._own_storage)."""
    samples = group_samples([(6, [5, 3, 4]), (4, [2, 7])]) + [Sample([1, 2, 3], [0, 0, 0], [0.0] * 3, 0.5)]
    plan = plan_micro_batches(samples, 1, 0, 2, 20, True, 0, always_pack=True)
    plan.append(padded_micro_batch(group_samples([(3, [2, 5])]), 0))
    moved = micro_batches_to(plan, "cpu")
    storages: dict[torch.dtype, list[tuple[int, int]]] = {}  # dtype -> (start, bytes) of each tensor
    for before, after in zip(plan, moved, strict=True):
        pairs = [(getattr(before, f), getattr(after, f)) for f in before.__dataclass_fields__]
        if before.packed:
            pairs += [(getattr(before.layout, f), getattr(after.layout, f)) for f in ("cu_q", "cu_k", "key_index")]
            assert after.layout.segments == before.layout.segments and after.layout.max_q == before.layout.max_q
        for b, a in pairs:
            if isinstance(b, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b) and a is not b and a.data_ptr() % 16 == 0
                assert a.storage_offset() == 0
                storages.setdefault(a.dtype, []).append((a.data_ptr(), a.numel() * a.element_size()))
            elif b is None or not dataclasses.is_dataclass(b):
                assert a == b
    assert {torch.long, torch.int32, torch.bool, torch.float32} <= set(storages)
    for parts in storages.values():  # end to end, 16-byte aligned: one buffer
        assert max(p + n for p, n in parts) - min(p for p, _ in parts) <= sum(-(-n // 16) * 16 for _, n in parts)


def test_first_trained_position_of_a_sample():
    assert first_trained(Sample([5, 6, 7, 8], [0, 0, 1, 1], [0.0] * 4, 0.0)) == 2
    assert first_trained(Sample([5, 6, 7], [True, False, True], [0.0] * 3, 0.0)) == 2  # position 0 never trains
    assert first_trained(Sample([5, 6, 7], [0, 0, 0], [0.0] * 3, 0.0)) == 3


def test_plan_without_padding_free_is_padded_micro_batches_of_micro_batch_size():
    """padding_free = false: this process's shard in padded micro batches of micro_batch_size
    samples, whatever packing would save; the two processes' shards cover the batch once."""
    samples = group_samples([(4, [20, 2, 9, 5]), (6, [3, 3, 7, 1])])
    plans = [plan_micro_batches(samples, 2, rank, 2, None, True, 0, padding_free=False) for rank in (0, 1)]
    assert [len(p) for p in plans] == [2, 2]
    assert all(not mb.packed and mb.input_ids.shape[0] == 2 for p in plans for mb in p)
    assert sum(mb.tokens for p in plans for mb in p) == sum(len(s.input_ids) for s in samples)
    assert sum(int(mb.loss_mask.sum()) for p in plans for mb in p) == sum(sum(s.loss_mask[1:]) for s in samples)


@pytest.fixture(scope="module")
def smol(model_dir):
    from transformers import AutoModelForCausalLM

    register_attention()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_packed_forward_matches_the_padded_forward(smol, share_prompts, chunked):
    """Two groups with different prompt lengths: the packed row (optionally with each prompt once)
    gives the padded micro batch's log-probs, entropies and gradients, with the LM head chunked
    (3 rows at a time) or not."""
    samples = group_samples([(9, [6, 2, 7]), (4, [5, 3])])
    weights = torch.randn(len(samples), 32, generator=torch.Generator().manual_seed(1))  # per absolute position
    padded = micro_batches(samples, len(samples), pad_token_id=0)[0]
    start = first_trained_position(padded["loss_mask"])
    smol.zero_grad()
    lp_ref, ent_ref = policy_logprobs(smol, padded, start)
    mask_ref = padded["loss_mask"][:, start:]
    (lp_ref * weights[:, start:start + lp_ref.shape[1]]).masked_fill(~mask_ref, 0).sum().backward()
    grads_ref = {n: p.grad.clone() for n, p in smol.named_parameters()}

    mb = packed_micro_batch(samples, share_prompts)
    assert mb.tokens == (9 + 4 + 6 + 2 + 7 + 5 + 3 if share_prompts else sum(len(s.input_ids) for s in samples))
    smol.zero_grad()
    import vf_rl.trainer.speed.logprobs as packing

    old = packing.LOGPROB_CHUNK_BYTES
    packing.LOGPROB_CHUNK_BYTES = 3 * 4 * smol.config.vocab_size
    try:
        lp, ent = packed_policy_logprobs(smol, mb, chunked=chunked)
    finally:
        packing.LOGPROB_CHUNK_BYTES = old
    cols = torch.tensor([s.prompt_len for s in samples])[:, None] + torch.arange(lp.shape[1])
    (lp * weights.gather(1, cols)).masked_fill(~mb.loss_mask, 0).sum().backward()
    for b, s in enumerate(samples):  # row b's columns: padded from `start`, packed from the sample's prompt_len
        n = len(s.input_ids) - s.prompt_len
        off = s.prompt_len - start
        assert torch.allclose(lp[b, :n], lp_ref[b, off:off + n], atol=2e-5), b
        assert torch.allclose(ent[b, :n], ent_ref[b, off:off + n], atol=2e-5), b
        assert mb.loss_mask[b, :n].all() and not mb.loss_mask[b, n:].any()
    for name, p in smol.named_parameters():  # float32 sums in another order: relative L2 difference
        diff = float((p.grad - grads_ref[name]).norm() / grads_ref[name].norm())
        assert diff < 1e-4, (name, diff)
    assert any(p.grad.abs().sum() > 0 for p in smol.parameters())


@pytest.mark.parametrize("share_prompts,budget,max_seq_len", [(False, 0, 0), (True, 0, 0), (True, 512, 64),
                                                                (False, 512, 16)])
def test_bucketed_micro_batch_keeps_the_log_probs_and_gradients(smol, share_prompts, budget, max_seq_len):
    """``pad_to_buckets`` (CUDA graphs' fixed shapes) appends padding segments to the packed row:
    the row, segment count and gathered keys become bucket sizes, while the log-probs, entropies
    and gradients of the real tokens are the unpadded micro batch's. With a ``max_seq_len`` bound
    (the varlen kernel's longest segments when compiled) no padding segment's queries or keys
    exceed it: a row padded far (a large budget) takes more padding segments, still a power of two."""
    samples = group_samples([(9, [6, 2, 7]), (4, [5, 3])], seed=4)
    weights = torch.randn(len(samples), 16, generator=torch.Generator().manual_seed(2))
    results = []
    for pad in (False, True):
        mb = packed_micro_batch(samples, share_prompts, max_seq_len)
        if pad:
            plain, mb = mb, pad_to_buckets(mb, pad_token_id=0, token_budget=budget)
            n, s = mb.input_ids.shape[1], mb.layout.cu_q.shape[0] - 1
            assert n == bucket(max(n, budget), 64) > plain.input_ids.shape[1]
            assert s == bucket(s, 4, per_octave=1) > len(samples) * (1 + bool(max_seq_len))
            assert mb.layout.bound == max_seq_len
            if max_seq_len:
                assert max(mb.layout.cu_q.diff().max(), mb.layout.cu_k.diff().max()) <= max_seq_len
            assert mb.position_ids.shape == mb.input_ids.shape and len(mb.layout.segments) == s
            assert int(mb.layout.cu_q[-1]) == n and (mb.layout.cu_q.diff() > 0).all()
            assert torch.equal(mb.input_ids[:, :plain.input_ids.shape[1]], plain.input_ids)
            if share_prompts:
                k = mb.layout.key_index.shape[0]
                assert k == int(mb.layout.cu_k[-1]) == bucket(k, 64) and int(mb.layout.key_index.max()) < n
            else:
                assert mb.layout.key_index is None and torch.equal(mb.layout.cu_k, mb.layout.cu_q)
            assert mb.tokens == plain.tokens and torch.equal(mb.predict_index, plain.predict_index)
        smol.zero_grad()
        lp, ent = packed_policy_logprobs(smol, mb)
        (lp * weights[:, :lp.shape[1]]).masked_fill(~mb.loss_mask, 0).sum().backward()
        results.append((lp.detach(), ent, {n: p.grad.clone() for n, p in smol.named_parameters()}))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(ent1, ent0, atol=1e-5)
    for name in g0:
        assert float((g1[name] - g0[name]).norm() / g0[name].norm()) < 1e-4, name


def test_a_micro_batch_of_bucket_sizes_is_not_padded():
    """A packed row already of the budget's bucket with a power-of-two segment count (a fixed-length
    batch: 8 samples of 8 tokens) keeps its shape; a larger budget, another segment count or
    gathered keys off the grid pad it as before."""
    samples = group_samples([(4, [4, 4, 4, 4]), (4, [4, 4, 4, 4])])
    mb = packed_micro_batch(samples)
    assert mb.input_ids.shape[1] == 64 and pad_to_buckets(mb, pad_token_id=0, token_budget=64) is mb
    assert pad_to_buckets(mb, pad_token_id=0, token_budget=65).input_ids.shape[1] == bucket(64 + 8, 64) == 72
    fewer = packed_micro_batch(samples[:6] + [Sample([5] * 16, [0] * 8 + [1] * 8, [0.0] * 16, 0.5)])
    assert fewer.input_ids.shape[1] == 64 and pad_to_buckets(fewer, pad_token_id=0).input_ids.shape[1] > 64
    # a bound only where every segment's queries and keys are within it (else the row's length stands)
    assert packed_micro_batch(samples, max_seq_len=8).layout.bound == 8
    assert packed_micro_batch(samples, max_seq_len=7).layout.bound == 0
    shared = packed_micro_batch(samples, share_prompts=True)  # 40 tokens, 8 segments, 64 keys
    assert shared.input_ids.shape[1] == 40 and pad_to_buckets(shared, pad_token_id=0, token_budget=64).input_ids.shape[1] == 64


def test_bucketed_plans_have_few_shapes():
    """Over many batches of random lengths, bucketed micro batches (every one packed) take a few
    distinct ``(N, S, K)`` shapes: the row padded to the token budget's bucket (a sample longer than
    the budget: its own), within an eighth of its power of two."""
    g = torch.Generator().manual_seed(0)
    bucket_sizes = [bucket(n, 64) for n in range(1, 5000)]
    assert all(b == 64 if n <= 64 else b >= n and (b - n) * 8 <= n for n, b in zip(range(1, 5000), bucket_sizes))
    assert len(set(bucket_sizes)) < 60
    shapes, plans = set(), 0
    for step in range(40):
        spec = [(int(torch.randint(20, 300, (), generator=g)), torch.randint(5, 500, (8,), generator=g).tolist())
                for _ in range(4)]
        for share in (False, True):
            for mb in plan_micro_batches(group_samples(spec, seed=step), 1, 0, 8, 2048, share, 0, True, bucketed=True):
                assert mb.packed
                n = mb.input_ids.shape[1]
                real = mb.tokens + mb.layout.cu_q.shape[0] - 1 - mb.valid.shape[0]  # + one token per padding segment
                assert n == bucket(max(real, 2048), 64)  # the budget's bucket, or a longer sample's
                k = None if mb.layout.key_index is None else mb.layout.key_index.shape[0]
                shapes.add((share, n, mb.layout.cu_q.shape[0], k))
                plans += 1
    assert plans > 150 and len(shapes) < plans / 10, (plans, len(shapes), sorted(shapes, key=str))


@pytest.mark.parametrize("ragged", [False, True])
def test_padded_forward_with_chunked_head_matches_policy_logprobs(smol, ragged):
    """The padded form of a micro batch (chunked LM head, no mask when no row is padded) gives
    ``policy_logprobs``'s log-probs, entropies and gradients."""
    samples = group_samples([(9, [6, 2, 7]), (4, [5, 3])] if ragged else [(5, [6]), (5, [6]), (5, [6])])
    weights = torch.randn(len(samples), 32, generator=torch.Generator().manual_seed(2))
    padded = micro_batches(samples, len(samples), pad_token_id=0)[0]
    start = first_trained_position(padded["loss_mask"])
    smol.zero_grad()
    lp_ref, ent_ref = policy_logprobs(smol, padded, start)
    mask_ref = padded["loss_mask"][:, start:]
    (lp_ref * weights[:, :lp_ref.shape[1]]).masked_fill(~mask_ref, 0).sum().backward()
    grads_ref = {n: p.grad.clone() for n, p in smol.named_parameters()}
    mb = padded_micro_batch(samples, pad_token_id=0)
    assert (mb.attention_mask is None) == (not ragged)
    smol.zero_grad()
    lp, ent = padded_policy_logprobs(smol, mb)
    (lp * weights[:, :lp.shape[1]]).masked_fill(~mb.loss_mask, 0).sum().backward()
    assert torch.equal(mb.loss_mask, mask_ref)
    assert torch.allclose(lp.masked_fill(~mask_ref, 0), lp_ref.masked_fill(~mask_ref, 0), atol=2e-5)
    assert torch.allclose(ent.masked_fill(~mask_ref, 0), ent_ref.masked_fill(~mask_ref, 0), atol=2e-5)
    for name, p in smol.named_parameters():
        diff = float((p.grad - grads_ref[name]).norm() / grads_ref[name].norm())
        assert diff < 1e-4, (name, diff)


@pytest.mark.parametrize("keep", [False, True, "frozen"])
def test_chunked_logprobs_match_the_full_logits(keep):
    """Values, entropy and gradients (hidden states and LM-head weight) against
    ``selective_logprobs`` on the full float64 logits, temperature 0.7, chunks of 4 rows, the
    logits recomputed in the backward pass or kept."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (11,), generator=g)
    upstream = torch.randn(11, generator=g, dtype=torch.float64)
    weight.requires_grad_(keep != "frozen")
    lp, ent = chunked_logprobs(hidden, weight, targets, 0.7, chunk=4, keep=keep is True)
    (lp.double() * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone() if weight.grad is not None else None
    weight.requires_grad_(True)
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = selective_logprobs((hidden @ weight.T)[None], targets[None], 0.7)
    (ref_lp[0].double() * upstream).sum().backward()
    assert lp.dtype == torch.float32 and not ent.requires_grad
    assert torch.allclose(lp.double(), ref_lp[0].double(), atol=1e-5)
    assert torch.allclose(ent.double(), ref_ent[0].double(), atol=1e-5)
    assert torch.allclose(grads[0], hidden.grad, atol=1e-5)
    assert (grads[1] is None) if keep == "frozen" else torch.allclose(grads[1], weight.grad, atol=1e-5)


def test_chunked_logprobs_frozen_head_and_bf16():
    """A frozen head (LoRA) gets no gradient; bf16 inputs match the bf16 full-logits path."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, 32, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(64, 32, generator=g).bfloat16()
    targets = torch.randint(0, 64, (7,), generator=g)
    lp, _ = chunked_logprobs(hidden, weight, targets, chunk=2)
    lp.sum().backward()
    ref_h = hidden.detach().clone().requires_grad_()
    ref, _ = selective_logprobs((ref_h @ weight.T)[None], targets[None])
    ref.sum().backward()
    assert torch.allclose(lp, ref[0], atol=2e-2)
    assert torch.allclose(hidden.grad.float(), ref_h.grad.float(), atol=2e-2)


def test_training_step_packed_equals_padded(model_dir, tmp_path):
    """A real RLTrainer on SmolLM2: padded micro batches, packed ones and packed ones with shared
    prompts (token budgets that split the batch differently) give the same loss, statistics and
    gradients (the loss normalisation is unchanged)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    samples = group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=3)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    noise = torch.Generator().manual_seed(0)  # the same sampling log-probs whatever ran before in this process
    with torch.no_grad():  # sampling log-probs near the model's own, so the ratios stay unmasked
        for s in samples:
            ids = torch.tensor([s.input_ids])
            own, _ = selective_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
            s.sampling_logprobs = [0.0] + (own[0] + 0.05 * torch.randn(len(own[0]), generator=noise)).tolist()
    results = {}
    for name, keys in {"padded": dict(padding_free=False), "packed": dict(share_prompts=False, micro_batch_tokens=40),
                       "shared": dict(micro_batch_tokens=40)}.items():
        args = RLConfig(output_dir=str(tmp_path / name), use_cpu=True, batch_size=8, rollouts_per_example=4,
                        micro_batch_size=4, max_seq_len=32, max_steps=1, report_to=[], use_lora=False, **keys)
        trainer = RLTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), env=env,
                            args=args, processing_class=tokenizer, served_model_name="t")
        trainer.model.zero_grad()
        loss, stats = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[], metrics={}))
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results[name] = (float(loss), stats, grad)
    loss_ref, stats_ref, grad_ref = results["padded"]
    assert stats_ref["tokens/trained"] == sum(len(s.input_ids) for s in samples)
    # 40-token budget: group 0 (9 + 19 tokens) and group 1's first rollout (5 + 5) fit, its other
    # three rollouts go to a second micro batch with a second copy of the prompt
    assert results["shared"][1]["tokens/trained"] == 9 + 5 + 5 + sum(len(s.input_ids) - s.prompt_len for s in samples)
    for name in ("packed", "shared"):
        loss, stats, grad = results[name]
        assert loss == pytest.approx(loss_ref, rel=1e-5) and loss != 0.0
        assert stats["tokens/loss"] == stats_ref["tokens/loss"] == 36
        for key in ("importance_ratio", "mismatch_kl", "entropy"):
            assert stats[key] == pytest.approx(stats_ref[key], rel=1e-4, abs=1e-6), (name, key)
        # a log-prob itself (not a ratio): float32 log-softmax over the vocabulary in other matmul shapes
        assert stats["logprob_diff/max"] == pytest.approx(stats_ref["logprob_diff/max"], abs=5e-5), name
        assert float((grad - grad_ref).norm() / grad_ref.norm()) < 1e-4, name


def test_triton_row_kernels_match_the_torch_rows(tmp_path):
    """The fused Triton kernels of the LM-head log-probs (CUDA only in training) in Triton's CPU
    interpreter against the float32 torch chunks: values, entropy and both gradients, a
    vocabulary over one block, temperature 0.7, logits kept and recomputed, float32 and bf16."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text('''
import torch
import vf_rl.trainer.speed.logprobs as P
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for keep, frozen in ((True, False), (False, False), (False, True)):
        h = torch.randn(9, 16, dtype=dtype, requires_grad=True)
        w = torch.randn(5000, 16, dtype=dtype, requires_grad=not frozen)
        y, up = torch.randint(0, 5000, (9,)), torch.randn(9)
        res = []
        for fused in (True, False):
            P._use_triton = lambda z, fused=fused: fused
            h.grad = w.grad = None
            lp, ent = P.chunked_logprobs(h, w, y, 0.7, chunk=4, keep=keep)
            (lp * up).sum().backward()
            res.append((lp.detach(), ent, h.grad.clone()) + (() if frozen else (w.grad.clone(),)))
        for name, a, b in zip(("logprobs", "entropy", "grad_h", "grad_w"), *res):
            err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
            # the entropy (lse - sum p z, logged only) loses digits to cancellation: 1.1e-5 seen in float32
            bound = 2e-2 if dtype == torch.bfloat16 else 5e-5 if name == "entropy" else 1e-5
            assert err < bound, (dtype, keep, name, err)
print("ok")
''')
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_lora_step_under_autocast_skips_the_input_casts_exactly(model_dir, tmp_path, monkeypatch):
    """bf16 model, float32 LoRA adapter, bf16 autocast (accelerate's, on the CPU): the step
    without peft's input casts gives bitwise the same loss and adapter gradients as with them,
    and runs fewer tensor copies (two forward, two backward per LoRA layer and micro batch: 43%
    fewer here)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import vf_rl.trainer.micro_step as micro_step_module
    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch

    class CountCopies(TorchDispatchMode):
        copies = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
                CountCopies.copies += 1
            return func(*args, **(kwargs or {}))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    samples = group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=3)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, batch_size=8, rollouts_per_example=4,
                    micro_batch_size=4, micro_batch_tokens=40, max_seq_len=32, max_steps=1, report_to=[],
                    use_lora=True, lora_rank=4, lora_alpha=8)
    args.bf16, args.mixed_precision = True, "bf16"  # the config refuses bf16 on the CPU: CPU autocast stands in here
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():  # sampling log-probs near the model's own, so the ratios stay unmasked
        for s in samples:
            ids = torch.tensor([s.input_ids])
            own, _ = selective_logprobs(model(input_ids=ids).logits[:, :-1].float(), ids[:, 1:])
            s.sampling_logprobs = [0.0] + own[0].tolist()
    trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t")
    assert trainer.accelerator.native_amp
    adapter = [p for p in trainer.model.parameters() if p.requires_grad]
    assert adapter and all(p.dtype == torch.float32 for p in adapter)
    with torch.no_grad():  # a non-zero LoRA B, so both adapter matrices get gradients
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))

    def step():
        trainer.model.zero_grad()
        CountCopies.copies = 0
        with CountCopies():
            loss, _ = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[], metrics={}))
        return loss, [p.grad.clone() for p in adapter], CountCopies.copies

    loss, grads, copies = step()
    casting = [m.cast_input_dtype_enabled for m in trainer.model.modules() if hasattr(m, "cast_input_dtype_enabled")]
    assert casting and all(casting)  # turned off for the step only
    monkeypatch.setattr(micro_step_module, "lora_input_casts_off", lambda model, autocast: contextlib.nullcontext())
    loss_cast, grads_cast, copies_cast = step()
    assert float(loss) != 0.0 and torch.equal(loss, loss_cast)
    assert all(torch.equal(g, h) for g, h in zip(grads, grads_cast)) and any(g.abs().sum() > 0 for g in grads)
    lora_layers = sum(1 for n, _ in trainer.model.named_modules() if n.endswith(".lora_A"))
    micro = len(plan_micro_batches(samples, 1, 0, 4, 40, True, 0))
    # 4 per layer, 3 where the layer's input needs no gradient (the first layer's attention)
    assert copies_cast - copies >= 3.9 * lora_layers * micro, (copies_cast, copies, lora_layers, micro)


def test_a_step_turns_training_mode_on_only_where_it_is_off(model_dir, tmp_path, monkeypatch):
    """A step after an evaluation (the model in eval mode) trains with every module in training
    mode; a step with every module already training does not call ``Module.train`` (its walk over
    every module is host time at the start of each step, with the GPU idle)."""
    from test_compile import _trainer, group_samples
    from transformers import AutoTokenizer

    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch

    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = _trainer(model_dir, tmp_path, "mode", AutoTokenizer.from_pretrained(model_dir), env)
    batch = Batch(step=0, samples=group_samples([(9, [6, 2, 7, 4]), (5, [5, 3, 1, 8])], seed=3), rollouts=[],
                  metrics={})
    calls = []
    train = torch.nn.Module.train
    monkeypatch.setattr(torch.nn.Module, "train", lambda self, mode=True: calls.append(mode) or train(self, mode))
    trainer.model.eval()
    trainer._train_on_batch(trainer.model, batch)
    assert True in calls and all(m.training for m in trainer.model.modules())
    calls.clear()
    trainer._train_on_batch(trainer.model, batch)
    assert calls == []


def test_training_mode_bookkeeping_does_not_keep_a_model_alive():
    """``train_mode`` remembers each model's modules without holding the model: a trainer's model
    is freed with the trainer (a strong list, which holds the model itself, kept every one alive)."""
    import gc
    import weakref

    from vf_rl.trainer.model import train_mode

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).eval()
    train_mode(model)
    assert all(m.training for m in model.modules())
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
