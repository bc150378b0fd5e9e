"""``atgrpo bench scale --quick --axes turns,agents``: a real multi-turn, multi-agent tree rollout per point, and the
claims it can refute: exactly turns x agents nodes run, prompts grow with the transcript, the rollout's seconds
grow with the nodes, and the per-branch baseline and per-sample update cost more than what ships."""

import json

import torch

from atgrpo.bench import scale
from atgrpo.bench.common import Shape, make_policy, suppress_eos
from atgrpo.bench.scale_team import PerBranch
from atgrpo.bench.scripted_turns import ScriptedTurns, team_roles
from atgrpo.cli import main
from atgrpo.envs import check_env
from atgrpo.rollout.sampling import Sampling
from atgrpo.rollout.tree import tree_rollout


def test_quick_scale_on_turns_and_agents_times_a_team_rollout(tmp_path):
    out = tmp_path / "scale"
    assert main(["bench", "scale", "--quick", "--axes", "turns,agents", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads((out / "scale.json").read_text())
    base = result["base"]
    assert list(result["axes"]) == ["turns", "agents"]
    for axis, other in (("turns", "agents"), ("agents", "turns")):
        a = result["axes"][axis]
        assert [p["value"] for p in a["points"]] == scale.QUICK[axis]
        for p in a["points"]:
            nodes = p["value"] * base[other]
            assert p["info"]["nodes"] == nodes and p["info"]["samples"] == base["problems"] * base["K"] * nodes
            assert p["info"]["turns_run"] == (p["value"] if axis == "turns" else base["turns"])
            for m in (*scale.METHODS, *scale.STEPS):
                assert p[m]["seconds"] > 0 and p[m]["tokens_per_s"] > 0, (axis, m, p[m])
            assert p["step_shipped"]["seconds"] == p["rollout_tree"]["seconds"] + p["update_shared_prefix"]["seconds"]
            assert p["rollout_per_branch"]["seconds"] > p["rollout_tree"]["seconds"], (axis, p)
        # prompts grow with the kept transcript
        assert [p["info"]["prompt_tokens_max"] for p in a["points"]] == sorted(
            {p["info"]["prompt_tokens_max"] for p in a["points"]})
        last = a["points"][-1]
        assert last["update_shared_prefix"]["seconds"] < last["update_per_sample"]["seconds"], last
        # every (turn, agent) node is one more batched generate: the rollout grows at least ~linearly in them
        assert a["slopes"]["rollout_tree"] > 0.5, a["slopes"]
        assert (out / f"scale_{axis}.png").stat().st_size > 1000
    md = (out / "scale.md").read_text()
    assert "| turns | rollout_tree |" in md and "| agents | step_shipped |" in md and "peak MiB" in md


def test_scripted_turns_runs_exactly_its_turns_with_the_transcript_in_the_prompt():
    env = ScriptedTurns("problem", agents=3, max_turns=2)
    check_env(env)
    env.reset(0)
    order = []
    while not env.done:
        order.append((env.turn, env.current_agent))
        env.step(f"said by {env.current_agent}")
    assert order == [(t, a) for t in range(2) for a in team_roles(3)]
    assert env.truncated and not env.terminated
    assert "agent_3: said by agent_3" in env.observe("agent_1")


def test_tree_rollout_over_a_scripted_team_with_and_without_per_branch_requests():
    shape = Shape(prompts=2, prompt_len=(32, 32), K=3, new_tokens=4)
    policy = make_policy(shape)
    hook = suppress_eos(policy.model, policy.eos_id)
    try:
        routes = {r: policy.policy_id for r in team_roles(2)}
        for pol in (policy, PerBranch(policy)):
            envs = [ScriptedTurns(f"problem {i}", agents=2, max_turns=3) for i in range(2)]
            for i, e in enumerate(envs):
                e.reset(i)
            samples, episodes = tree_rollout(envs, {policy.policy_id: pol}, routes, Sampling(3, 1.0, 4),
                                             torch.Generator().manual_seed(0))
            assert len(samples) == 2 * 3 * 2 * 3 and all(len(s.response_ids) == 4 for s in samples)
            assert all(e.turns == 3 for e in episodes) and all(not e.done for e in envs)  # inputs not stepped
            first = [s for s in samples if s.problem == episodes[0].problem]
            lens = [len(s.prompt_ids) for s in first]
            assert lens == sorted(lens) and lens[-1] > lens[0]  # prompts grow node by node
    finally:
        hook.remove()
