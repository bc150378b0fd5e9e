"""``algo.warmup_steps``: the learning rate rises linearly over the first optimizer steps of each policy.

AdamW's first step moves every weight with a gradient by about ``lr`` (its moments make the step g / |g|);
warm-up scales that first step down. Checked by hand-computed rates, and by the size of real AdamW steps."""

from __future__ import annotations

import copy

import pytest
import torch

from atgrpo.config import AlgoConfig
from atgrpo.trainer.update import make_optimizer, optimizer_steps_done, update_policy, warmup_lr
from test_shared_prefix import _batch, _policy, _samples


def test_warmup_lr_by_hand():
    assert [warmup_lr(1.0, i, 4) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [warmup_lr(2e-5, i, 0) for i in range(3)] == [2e-5] * 3
    assert warmup_lr(3.0, 0, 1) == 3.0


def _first_steps(warmup: int, updates: int = 2):
    """Largest weight change of each AdamW step (two per update), and the optimizer's lr after the updates."""
    policy = _policy(3)
    prompts, responses = _batch([9, 14], 4, seed=2)
    samples = _samples(prompts, responses, policy)
    algo = AlgoConfig(lr=1e-3, warmup_steps=warmup, minibatches=1, micro_batch_size=16)
    opt = make_optimizer(policy, algo)
    moves = []
    for _ in range(updates):
        before = [p.detach().clone() for p in policy.model.parameters()]
        update_policy(policy, opt, copy.deepcopy(samples), algo, 1.0, torch.Generator().manual_seed(0))
        moves.append(max(float((p.detach() - b).abs().max()) for p, b in zip(policy.model.parameters(), before)))
    return moves, opt.param_groups[0]["lr"], optimizer_steps_done(opt)


def test_first_adamw_step_is_lr_over_warmup():
    (m_const, _), lr_const, n = _first_steps(0)
    assert n == 2 and lr_const == pytest.approx(1e-3)
    assert m_const == pytest.approx(1e-3, rel=0.05)  # AdamW's first step: about lr on the weights it moves
    (m1, m2), lr_after, _ = _first_steps(4)
    assert m1 == pytest.approx(0.25e-3, rel=0.05)  # lr / 4
    assert lr_after == pytest.approx(0.5e-3)  # the second step ran at 2 lr / 4
    assert m2 < m_const


def test_config_rejects_negative_warmup():
    from atgrpo.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config(None, ["algo.warmup_steps=-1"])


def test_warmstart_schedule_by_hand():
    """``warmstart.warmup_steps``: the default 20-step warm-up caps a 10-step warm start at 0.15 of its lr
    (the overlap of warm-up and decay); a 2-step warm-up reaches the full lr at the second step."""
    from atgrpo.trainer.warmstart import warmstart_lr_factor
    default = [warmstart_lr_factor(i, 10, 20) for i in range(10)]
    assert max(default) == pytest.approx(0.15)
    assert default[:3] == pytest.approx([0.05, 0.1 * 0.9, 0.15 * 0.8])
    short = [warmstart_lr_factor(i, 10, 2) for i in range(10)]
    assert short[:3] == pytest.approx([0.5, 0.9, 0.8])
    assert short[-1] == pytest.approx(0.1)  # the decay's floor
    assert [warmstart_lr_factor(i, 200, 20) for i in (19, 100)] == pytest.approx([1.0 * 0.905, 0.5])


def test_warmstart_warmup_is_configured():
    from atgrpo.config import ConfigError, load_config
    assert load_config(None, ["warmstart.warmup_steps=3"]).warmstart.warmup_steps == 3
    assert load_config(None, []).warmstart.warmup_steps == 20
    with pytest.raises(ConfigError):
        load_config(None, ["warmstart.warmup_steps=0"])
