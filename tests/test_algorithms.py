"""The math of AT-GRPO (atgrpo/algorithms): group keys, group-relative advantages, the PPO loss, the KL penalty.

Hand-computed examples and invariants; everything here runs in milliseconds on CPU.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import get_args

import pytest
import torch

from atgrpo.algorithms.advantages import grouped_advantages
from atgrpo.algorithms.grouping import GROUP_KEYS, check_group_sizes, group_index, group_key_fn, key_str
from atgrpo.algorithms.losses import aggregate, kl_penalty, policy_loss, ppo_token_loss
from atgrpo.algorithms.names import GroupKey


# ---- grouped advantages --------------------------------------------------------------------------------
def test_grouped_advantages_hand_example():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, zv = grouped_advantages(rewards, groups, std_normalize=True, eps=1e-6)
    s = math.sqrt(2.0 / 3.0)  # population std of [1, 2, 3]
    expected = torch.tensor([-1 / (s + 1e-6), 0.0, 1 / (s + 1e-6), 0.0, 0.0, 0.0])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert adv[0].item() == pytest.approx(-1.2247, abs=1e-4)
    assert zv.tolist() == [False, False, False, True, True, True]
    assert adv.dtype == torch.float32 and zv.dtype == torch.bool
    assert (adv[3:] == 0).all()  # exactly zero, not merely small


def test_grouped_advantages_no_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, zv = grouped_advantages(rewards, groups, std_normalize=False)
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), atol=1e-7)
    assert zv.tolist() == [False, False, False, True, True, True]


def test_grouped_advantages_interleaved_order():
    # the same two groups as above, members interleaved: group membership, not position, decides
    rewards = torch.tensor([5.0, 1.0, 5.0, 2.0, 3.0, 5.0])
    groups = torch.tensor([1, 0, 1, 0, 0, 1])
    adv, zv = grouped_advantages(rewards, groups, eps=0.0)
    s = math.sqrt(2.0 / 3.0)
    assert torch.allclose(adv, torch.tensor([0.0, -1 / s, 0.0, 0.0, 1 / s, 0.0]), atol=1e-6)
    assert zv.tolist() == [True, False, True, False, False, True]


def test_grouped_advantages_eps():
    r = torch.tensor([0.0, 1.0])
    g = torch.tensor([0, 0])
    # std = 0.5: eps enters the denominator as std + eps
    adv, _ = grouped_advantages(r, g, eps=1.0)
    assert torch.allclose(adv, torch.tensor([-0.5 / 1.5, 0.5 / 1.5]), atol=1e-7)
    adv, _ = grouped_advantages(r, g, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0]), atol=1e-7)
    # a tiny but real spread: std = 1e-6, eps = 1e-6 halves the advantages
    r = torch.tensor([0.0, 2e-6], dtype=torch.float64)
    adv, zv = grouped_advantages(r, g, eps=1e-6)
    assert torch.allclose(adv, torch.tensor([-0.5, 0.5]), atol=1e-5)
    assert not zv.any()


def test_grouped_advantages_equal_rewards_exactly_zero():
    # rewards equal up to float rounding (0.1 + 0.2 != 0.3) and large equal rewards: exactly zero, flagged
    r = torch.tensor([0.1 + 0.2, 0.3, 0.3, 1e6, 1e6, 1e6], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, zv = grouped_advantages(r, g)
    assert (adv == 0).all() and zv.all()
    # a group of one is a zero-variance group
    adv, zv = grouped_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert adv[0] == 0 and zv.tolist() == [True, False, False]


def _loop_advantages(rewards, groups, std_normalize, eps):
    out = [0.0] * len(rewards)
    zero = [False] * len(rewards)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        vals = [rewards[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i in idx:
            if std < 1e-9:
                out[i], zero[i] = 0.0, True
            else:
                out[i] = (rewards[i] - mean) / (std + eps) if std_normalize else rewards[i] - mean
    return out, zero


@pytest.mark.parametrize("std_normalize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_advantages_matches_loop(std_normalize, seed):
    rng = random.Random(seed)
    groups: list[int] = []
    rewards: list[float] = []
    for g in range(60):
        size = rng.randint(1, 12)
        groups += [g] * size
        kind = rng.random()
        if kind < 0.2:  # all equal
            rewards += [rng.choice([-0.2, 0.0, 1.5])] * size
        elif kind < 0.4:  # a few discrete values
            rewards += [rng.choice([-0.2, 0.0, 1.0]) for _ in range(size)]
        else:
            rewards += [rng.gauss(0, 3) for _ in range(size)]
    perm = list(range(len(groups)))
    rng.shuffle(perm)  # interleave the groups
    groups = [groups[i] for i in perm]
    rewards = [rewards[i] for i in perm]
    adv, zv = grouped_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups),
                                 std_normalize=std_normalize, eps=1e-6)
    ref, ref_zero = _loop_advantages(rewards, groups, std_normalize, 1e-6)
    assert torch.allclose(adv.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-5, rtol=1e-5)
    assert zv.tolist() == ref_zero
    # invariant: advantages sum to zero within each group
    sums = torch.zeros(60, dtype=torch.float64).index_add_(0, torch.tensor(groups), adv.double())
    assert sums.abs().max() < 1e-4


# ---- PPO loss --------------------------------------------------------------------------------------------
def _lp(ratios):
    return torch.log(torch.tensor(ratios, dtype=torch.float64))


def test_ppo_token_loss_hand_cases():
    # one token per sequence; old_logp = 0 so ratio = exp(logp)
    ratios = [1.5, 1.5, 0.5, 0.5, 1.1, 1.0]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, 3.0], dtype=torch.float64)
    logp = _lp(ratios)[:, None]
    loss, clipped = ppo_token_loss(logp, torch.zeros_like(logp), adv, 0.2, 0.2)
    # ratio 1.5, A>0: clipped to 1.2; A<0: pessimistic unclipped 1.5; ratio 0.5, A>0: unclipped; A<0: clipped 0.8
    expected = [-1.2, 1.5, -0.5, 0.8, -2.2, -3.0]
    assert torch.allclose(loss[:, 0], torch.tensor(expected, dtype=torch.float64), atol=1e-9)
    assert clipped[:, 0].tolist() == [True, False, False, True, False, False]


def test_ppo_asymmetric_clip():
    logp = _lp([1.25, 0.75, 1.25, 1.3])[:, None]
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    old = torch.zeros_like(logp)
    loss, clipped = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # 1.25 < 1.28: inside for A>0; 0.75 < 0.8: clipped up for A<0; 1.25, A<0: unclipped; 1.3 > 1.28: clipped
    assert torch.allclose(loss[:, 0], torch.tensor([-1.25, 0.8, 1.25, -1.28], dtype=torch.float64), atol=1e-9)
    assert clipped[:, 0].tolist() == [False, True, False, True]
    # the symmetric clip clips the first one
    loss_sym, clipped_sym = ppo_token_loss(logp, old, adv, 0.2, 0.2)
    assert loss_sym[0, 0].item() == pytest.approx(-1.2) and clipped_sym[0, 0]
    # a wide clip_low: ratio 0.75 with A<0 is no longer clipped
    loss_w, clipped_w = ppo_token_loss(logp, old, adv, clip_low=0.3, clip_high=0.28)
    assert loss_w[1, 0].item() == pytest.approx(0.75) and not clipped_w[1, 0]


def test_policy_loss_clipfrac_and_stats():
    logp = _lp([[1.5, 0.5, 1.0], [0.5, 1.5, 1.1]]).float()
    old = torch.zeros_like(logp)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, st = policy_loss(logp, old, adv, mask)
    # token losses: row0 [-1.2, -0.5, -1.0]; row1 [0.8, 1.5, (masked)]; clipped: row0 tok0, row1 tok0
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.0 + 0.8 + 1.5) / 5, abs=1e-6)
    assert st.clipped_tokens == 2 and st.tokens == 5
    expected_kl = 0.5 * sum(math.log(r) ** 2 for r in [1.5, 0.5, 1.0, 0.5, 1.5])
    assert st.kl_sum == pytest.approx(expected_kl, rel=1e-5)


def test_aggregation_hand_example():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(token_loss, mask, "token-mean", 4.0).item() == pytest.approx(2.5)  # (1+2+3+4)/4
    assert aggregate(token_loss, mask, "seq-mean", 2.0).item() == pytest.approx(3.0)  # (2 + 4)/2
    # the normaliser is the caller's (whole mini-batch), not this micro-batch's
    assert aggregate(token_loss, mask, "token-mean", 8.0).item() == pytest.approx(1.25)
    assert aggregate(token_loss, mask, "seq-mean", 4.0).item() == pytest.approx(1.5)


def test_policy_loss_aggregation_masked_example():
    # ratio 1 on real tokens (token loss = -A); padded positions hold garbage that must not count
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.7, 1.9]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -3.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tm, _ = policy_loss(logp, old, adv, mask, aggregation="token-mean")
    sm, _ = policy_loss(logp, old, adv, mask, aggregation="seq-mean")
    assert tm.item() == pytest.approx((-1 * 3 + 2 * 1) / 4)
    assert sm.item() == pytest.approx((-1 + 2) / 2)


def test_kl_penalty_values():
    logp = torch.tensor([[0.5, -1.0, 0.0]])
    ref = torch.tensor([[0.0, 0.0, 0.0]])
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([[0.5, -1.0, 0.0]]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([[0.125, 0.5, 0.0]]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, 0.0]
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.tensor([k3]), atol=1e-6)
    assert (kl_penalty(torch.randn(4, 5), torch.randn(4, 5), "k3") >= 0).all()  # k3 is non-negative
    # x = logp - ref, not ref - logp
    assert kl_penalty(torch.tensor([[0.0]]), torch.tensor([[0.5]]), "k1").item() == pytest.approx(-0.5)


def test_policy_loss_with_kl_term():
    logp = torch.tensor([[0.5, -1.0]])
    old = logp.clone()
    ref = torch.zeros_like(logp)
    mask = torch.ones_like(logp)
    adv = torch.tensor([0.0])
    loss, _ = policy_loss(logp, old, adv, mask, kl_coef=0.1, ref_logp=ref, kl_estimator="k2")
    assert loss.item() == pytest.approx(0.1 * (0.125 + 0.5) / 2)
    loss, stats = policy_loss(logp, old, adv, mask, kl_coef=0.1, ref_logp=ref, kl_estimator="k3")
    assert loss.item() == pytest.approx(0.1 * ((math.exp(-0.5) - 0.5) + (math.e - 2)) / 2, rel=1e-5)
    # the statistics carry the penalty's own estimate, summed over the unmasked tokens, without the coefficient
    assert stats.ref_kl_sum == pytest.approx((math.exp(-0.5) - 0.5) + (math.e - 2), rel=1e-5)
    _, stats = policy_loss(logp, old, adv, torch.tensor([[1.0, 0.0]]), kl_coef=0.1, ref_logp=ref, kl_estimator="k2")
    assert stats.ref_kl_sum == pytest.approx(0.125) and stats.tokens == 1
    assert policy_loss(logp, old, adv, mask)[1].ref_kl_sum == 0.0
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)


def test_errors_on_unknown_names():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(x, torch.ones(1, 2), "foo", 1.0)
    with pytest.raises(ValueError, match="foo"):
        policy_loss(x, x, torch.zeros(1), torch.ones(1, 2), aggregation="foo")
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="k4"):
        policy_loss(x, x, torch.zeros(1), torch.ones(1, 2), kl_coef=0.1, ref_logp=x, kl_estimator="k4")


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_gradient_accumulation_equals_full_batch(aggregation, kl_coef):
    torch.manual_seed(0)
    B, T, D = 8, 6, 5
    feats = torch.randn(B, T, D, dtype=torch.float64)
    w = torch.nn.Parameter(torch.randn(D, dtype=torch.float64) * 0.3)
    old = torch.randn(B, T, dtype=torch.float64) * 0.3
    ref = torch.randn(B, T, dtype=torch.float64) * 0.3
    adv = torch.randn(B, dtype=torch.float64)
    lens = [6, 1, 3, 5, 2, 6, 4, 1]  # ragged: token-mean and seq-mean differ
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lens):
        mask[i, :n] = 1

    def logp_of(rows):
        return (feats[rows] @ w) * mask[rows]

    kw = dict(aggregation=aggregation, kl_coef=kl_coef, ref_logp=None, clip_low=0.2, clip_high=0.28)
    normalizer = float(mask.sum()) if aggregation == "token-mean" else float(B)
    rows = list(range(B))
    full, st_full = policy_loss(logp_of(rows), old, adv, mask, normalizer=normalizer, **{**kw, "ref_logp": ref})
    (g_full,) = torch.autograd.grad(full, w)
    # some tokens really are clipped, so the test covers both branches of the min
    assert 0 < st_full.clipped_tokens < st_full.tokens

    g_acc = torch.zeros_like(w)
    loss_acc = 0.0
    g_naive = torch.zeros_like(w)
    for i in range(B):
        r = [i]
        loss, _ = policy_loss(logp_of(r), old[r], adv[r], mask[r], normalizer=normalizer,
                              **{**kw, "ref_logp": ref[r]})
        g_acc += torch.autograd.grad(loss, w)[0]
        loss_acc += loss.item()
        naive, _ = policy_loss(logp_of(r), old[r], adv[r], mask[r], **{**kw, "ref_logp": ref[r]})  # own normaliser
        g_naive += torch.autograd.grad(naive, w)[0] / B
    assert loss_acc == pytest.approx(full.item(), rel=1e-10, abs=1e-12)
    assert torch.allclose(g_acc, g_full, rtol=1e-10, atol=1e-12)
    if aggregation == "token-mean":  # averaging per-micro-batch token means is a different (wrong) estimator
        assert not torch.allclose(g_naive, g_full, rtol=1e-3, atol=1e-6)


def test_default_normalizer_is_whole_batch():
    logp = torch.randn(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    adv = torch.randn(3)
    a, _ = policy_loss(logp, logp.detach(), adv, mask, aggregation="token-mean")
    b, _ = policy_loss(logp, logp.detach(), adv, mask, aggregation="token-mean", normalizer=7.0)
    assert a.item() == pytest.approx(b.item())
    a, _ = policy_loss(logp, logp.detach(), adv, mask, aggregation="seq-mean")
    b, _ = policy_loss(logp, logp.detach(), adv, mask, aggregation="seq-mean", normalizer=3.0)
    assert a.item() == pytest.approx(b.item())


# ---- group keys ------------------------------------------------------------------------------------------
def test_group_key_functions_are_explicit_tuples():
    s = SimpleNamespace(problem="plan_path/train/10", turn=2, agent="plan", branch=5, policy="shared")
    assert group_key_fn("problem_turn_agent")(s) == ("plan_path/train/10", 2, "plan")
    assert group_key_fn("problem")(s) == ("plan_path/train/10",)
    assert group_key_fn("problem_agent")(s) == ("plan_path/train/10", "plan")
    assert group_key_fn("problem_turn")(s) == ("plan_path/train/10", 2)
    for name in GROUP_KEYS:
        assert isinstance(group_key_fn(name)(s), tuple)
    assert set(GROUP_KEYS) == set(get_args(GroupKey))  # the config's typed choice names exactly these
    # problems 1 and 10 never merge (no integer arithmetic on indices); policy and branch are not in the key
    t = SimpleNamespace(problem="plan_path/train/1", turn=2, agent="plan", branch=0, policy="other")
    assert group_key_fn("problem_turn_agent")(t) != group_key_fn("problem_turn_agent")(s)
    u = SimpleNamespace(problem="plan_path/train/10", turn=2, agent="plan", branch=0, policy="other")
    assert group_key_fn("problem_turn_agent")(u) == group_key_fn("problem_turn_agent")(s)
    assert key_str(("p/1", 2, "plan")) == "p/1/2/plan"


def test_group_key_fn_unknown():
    with pytest.raises(ValueError) as e:
        group_key_fn("problem_index_div_k")
    assert "problem_index_div_k" in str(e.value) and "problem_turn_agent" in str(e.value)


def test_check_group_sizes():
    keys = [("a", 0, "x")] * 3 + [("b", 0, "x")] * 3
    check_group_sizes(keys, 3)
    with pytest.raises(AssertionError, match="3"):
        check_group_sizes(keys + [("c", 0, "x")], 3)
    with pytest.raises(AssertionError):
        check_group_sizes(keys[:-1], 3)
    with pytest.raises(AssertionError):
        check_group_sizes(keys, 6)


def test_group_index_order_of_first_appearance():
    b, a, c = ("b", 1, "plan"), ("a", 0, "tool"), ("c", 0, "tool")
    ids, keys = group_index([b, a, b, c, a, c])
    assert ids == [0, 1, 0, 2, 1, 2]
    assert keys == [b, a, c]
    assert group_index([]) == ([], [])
