"""The common warm start of per-role policies (``warmstart.common``, the default): one fine-tuning on every
role's demonstrations, copied to every policy, so L2's adapters and L3's models all start from one checkpoint."""

from __future__ import annotations

import pytest
import torch

from atgrpo.config import load_config
from atgrpo.trainer.state import build_state
from atgrpo.trainer.warmstart import collect_demonstrations, warm_start

SMALL = ["model.tiny.num_layers=1", "model.tiny.hidden_size=32", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=64", "warmstart.episodes=8", "warmstart.epochs=1"]


@pytest.mark.parametrize("sharing", ["L2", "L3"])
def test_common_warm_start_gives_every_policy_the_same_weights(sharing):
    if sharing == "L2":
        pytest.importorskip("peft")
    cfg = load_config(None, SMALL + [f"policy.sharing={sharing}"])
    st = build_state(cfg)
    before = {pid: {k: v.clone() for k, v in p.model.state_dict().items()} for pid, p in st.policies.items()}
    losses = warm_start(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed, progress=False)
    assert losses["plan"] == losses["tool"]
    plan, tool = st.policies["plan"].model.state_dict(), st.policies["tool"].model.state_dict()
    assert plan.keys() == tool.keys() and all(torch.equal(plan[k], tool[k]) for k in plan)
    assert any(not torch.equal(before["tool"][k], tool[k]) for k in tool)  # both moved from their init
    # no gradient is left over for the evaluation and the first rollout to carry
    assert all(q.grad is None for pol in st.policies.values() for q in pol.model.parameters())
    # one fine-tuning on all demonstrations: the L1 warm start's steps, not one per role
    demos = collect_demonstrations(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed)
    assert sum(map(len, demos.values())) > max(map(len, demos.values()))


def test_per_role_warm_start_trains_each_policy_on_its_own():
    cfg = load_config(None, SMALL + ["policy.sharing=L3", "warmstart.common=false"])
    st = build_state(cfg)
    losses = warm_start(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed, progress=False)
    assert losses["plan"] != losses["tool"]
    plan, tool = st.policies["plan"].model.state_dict(), st.policies["tool"].model.state_dict()
    assert not all(torch.equal(plan[k], tool[k]) for k in plan)
