"""Teams of three: the math team with a verifier (``math_verify``), a turn order chosen by the environment,
the tree sampler with problems at different agents in one batch, and policy partitions (``policy.groups``).
"""

from __future__ import annotations

import re

import pytest
import torch

from atgrpo.config import ConfigError, load_config
from atgrpo.config.checks import route_agents
from atgrpo.envs import check_env, make
from atgrpo.envs.math_env import FORMAT_PENALTY
from atgrpo.envs.math_verify import read_decision
from atgrpo.rollout.sampling import Sampling
from atgrpo.rollout.tree import tree_rollout
from atgrpo.trainer.state import build_state
from atgrpo.trainer.step import train_step
from conftest import FAST
from scripted import ScriptedBytePolicy
from test_tree import _check_tree

ENV = dict(dataset="arithmetic", max_turns=3)
TEAM = ("tool", "reasoner", "verifier")
ROUTE = {a: "shared" for a in TEAM}


def _env(seed: int, style: str = "compact", split: str = "train"):
    env = make("math_verify", style=style, split=split, **ENV)
    env.reset(seed)
    return env


@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("roles", [None, ("reasoner",)])
def test_math_verify_passes_check_env(style, roles):
    check_env(make("math_verify", style=style, roles=roles, **ENV), episodes=6)


def test_read_decision():
    assert read_decision("ACCEPT") == ("accept", "")
    assert read_decision("  reject: the sign is wrong") == ("reject", "the sign is wrong")
    assert read_decision("REJECT TOOL: it prints 3") == ("reject-tool", "it prints 3")
    assert read_decision("reject tool") == ("reject-tool", "")
    assert read_decision("I think it's fine") == (None, "")
    assert read_decision("") == (None, "")


def test_the_verifier_chooses_who_acts_next_and_each_rejection_starts_a_turn():
    env = _env(5)
    gold = env.problem.answer
    assert env.current_agent == "tool"
    env.step(f"print({gold})")
    env.step("\\boxed{999999}")  # wrong
    assert (env.current_agent, env.turn) == ("verifier", 0)
    r = env.step("REJECT: does not match the program's output")
    assert r.reward.local == 1.0 and r.reward.team == 0.0 and not r.done  # a right rejection
    assert (env.current_agent, env.turn) == ("reasoner", 1)  # back to the reasoner; the tool is skipped
    assert "V:reject" in env.observe()
    env.step("\\boxed{999998}")
    r = env.step("REJECT TOOL: the program is wrong")  # right to reject, wrong about whom: still a right decision
    assert r.reward.local == 1.0
    assert (env.current_agent, env.turn) == ("tool", 2)
    env.step(f"print({gold})")
    env.step(f"\\boxed{{{gold}}}")
    r = env.step("ACCEPT")
    assert r.terminated and r.reward == type(r.reward)(team=1.0, local=1.0) and env.success


def test_wrong_accept_ends_the_episode_failed_and_no_decision_is_penalised():
    env = _env(6)
    env.step("print(1)")
    env.step("\\boxed{123456}")
    r = env.step("looks fine to me")  # no decision: a penalty, back to the reasoner
    assert r.reward.local == -FORMAT_PENALTY and r.info["parse_error"] and env.current_agent == "reasoner"
    env.step("\\boxed{123456}")
    r = env.step("ACCEPT")  # accepting a wrong answer: the episode ends, failed, no local reward
    assert r.terminated and r.reward.local == 0.0 and not env.success


def test_agreement_alone_does_not_end_a_three_role_episode():
    env = _env(7)
    gold = env.problem.answer
    env.step(f"print({gold})")
    r = env.step(f"\\boxed{{{gold}}}")
    assert not r.done and env.current_agent == "verifier"


# ---- code with a reviewer ------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("roles", [None, ("coder",)])
def test_code_review_passes_check_env(style, roles):
    check_env(make("code_review", style=style, roles=roles, max_turns=3), episodes=4)


def test_the_reviewer_ends_the_episode_or_sends_the_program_back():
    env = make("code_review", style="chat", max_turns=3)
    env.reset(3)
    env.step(env.expert_action("coder"))  # a correct program no longer ends the episode by itself
    env.step(env.expert_action("tester"))
    assert env.current_agent == "reviewer" and not env.done
    r = env.step("REVISE: handle the empty input")  # a correct program sent back: a wrong decision
    assert r.reward.local == 0.0 and r.reward.team == 1.0 and (env.current_agent, env.turn) == ("coder", 1)
    assert "handle the empty input" in env.observe()[1]["content"]
    env.step("print(1)")
    env.step(env.expert_action("tester"))
    r = env.step("LGTM")  # no decision: a penalty, back to the coder
    assert r.reward.local < 0 and r.info["parse_error"] and (env.current_agent, env.turn) == ("coder", 2)
    env.step(env.expert_action("coder"))
    env.step(env.expert_action("tester"))
    r = env.step("APPROVE")
    assert r.terminated and r.reward.local == 1.0 and env.success


def test_scripted_code_team_of_three_solves_held_out_problems():
    envs = []
    for s in range(4):
        env = make("code_review", style="chat", split="eval", max_turns=2)
        env.reset(s)
        envs.append(env)
    solved = 0
    for env in envs:  # the experts in turn: coder, tester, reviewer (approves the reference solution)
        while not env.done:
            env.step(env.expert_action(env.current_agent))
        solved += env.success and env.turn == 1
    assert solved == len(envs)


class ThreeRoleScript(ScriptedBytePolicy):
    """A team scripted from the compact prompts (``T0 Q:...``, ``R0 ... T:33``, ``V0 ... T:33 R:33``). The tool
    prints the answer, except in turn 0 of problems in ``bad_tool`` (gold + 1); the reasoner copies the tool's
    answer, except in turn 0 of problems in ``bad_reasoner``; the verifier accepts a correct answer, rejects the
    tool when the tool's answer is wrong, else the reasoner. Branch 0 is that answer, the others junk."""

    def __init__(self, golds: dict[str, str], bad_tool=(), bad_reasoner=()):
        super().__init__("shared")
        self.golds, self.bad_tool, self.bad_reasoner = golds, set(bad_tool), set(bad_reasoner)
        self.calls: list[list[str]] = []

    def answers(self, prompts, n):
        self.calls.append(prompts)
        return [[self._answer(p)] + ["zz"] * (n - 1) for p in prompts]

    def _answer(self, prompt: str) -> str:
        m = re.match(r"<?(\w)(\d+) Q:(\S+)", prompt.lstrip("\x01"))
        role, turn, q = m.group(1), int(m.group(2)), m.group(3)
        gold = self.golds[q]
        seen = dict(re.findall(r" ([TRV]):(\S+)", prompt))
        if role == "T":
            return f"print({int(gold) + 1 if turn == 0 and q in self.bad_tool else gold})"
        if role == "R":
            return f"\\boxed{{{int(seen['T']) + 7 if turn == 0 and q in self.bad_reasoner else seen['T']}}}"
        if seen.get("R") == gold:
            return "accept"
        return "reject tool" if seen.get("T") != gold else "reject"


def _golds(envs):
    return {e.problem.compact: e.problem.answer for e in envs}


def test_scripted_three_agent_team_solves_held_out_problems():
    envs = [_env(s, split="eval") for s in range(8)]
    pol = ThreeRoleScript(_golds(envs))
    samples, episodes = tree_rollout(envs, {"shared": pol}, ROUTE, Sampling(K=2, temperature=1.0, max_new_tokens=16))
    assert all(ep.success and ep.turns == 1 for ep in episodes)
    _check_tree(envs, samples, episodes, 2, 1.0, ROUTE)
    assert len(samples) == 8 * 3 * 2


def test_tree_invariants_with_problems_at_different_agents_in_one_batch():
    """After turn 0, problems wait at different agents: accepted (done), the reasoner sent back (turn 1 starts
    at the reasoner), the tool sent back (turn 1 starts at the tool). Each round groups the active problems by
    their agent: one ``generate`` per agent, every group keyed (problem, turn, agent) with K members."""
    envs = [_env(s) for s in range(12)]
    qs = [e.problem.compact for e in envs]
    pol = ThreeRoleScript(_golds(envs), bad_tool=qs[1::3], bad_reasoner=qs[2::3])
    samples, episodes = tree_rollout(envs, {"shared": pol}, ROUTE, Sampling(K=3, temperature=1.0, max_new_tokens=16))
    _check_tree(envs, samples, episodes, 3, 1.0, ROUTE)
    assert all(ep.success for ep in episodes)
    firsts = {s.problem: (s.turn, s.agent) for s in reversed(samples) if s.turn == 1}  # each problem's first node in turn 1
    assert set(firsts.values()) == {(1, "tool"), (1, "reasoner")}
    assert sum(1 for ep in episodes if ep.turns == 1) == 4
    for prompts in pol.calls:  # one agent per generate call
        assert len({re.match(r"\W*(\w)", p).group(1) for p in prompts}) == 1
    # the round after turn 0 batched the sent-back tools and reasoners in two calls, not one per problem
    mixed_round = [{re.match(r"\W*(\w)\d", p).group(1) for p in c} for c in pol.calls[3:5]]
    assert mixed_round == [{"T"}, {"R"}] or mixed_round == [{"R"}, {"T"}]


def test_groups_partition_roles_and_errors():
    def cfg(*extra):
        return load_config(None, ["env.name=math_verify", "env.style=compact", *extra])

    c = cfg("policy.sharing=L3", "policy.groups={a: [tool, verifier], b: [reasoner]}")
    assert route_agents(c, TEAM) == {"tool": "a", "reasoner": "b", "verifier": "a"}
    assert route_agents(cfg("policy.sharing=L2"), TEAM) == {a: a for a in TEAM}
    for bad, needle in [("policy.groups={a: [tool], b: [reasoner]}", "in none: ['verifier']"),
                        ("policy.groups={a: [tool, reasoner], b: [reasoner, verifier]}", "in two groups"),
                        ("policy.groups={a: [tool, critic], b: [reasoner, verifier]}", "unknown: ['critic']")]:
        with pytest.raises(ConfigError, match=re.escape(needle)):
            cfg("policy.sharing=L3", bad)
    with pytest.raises(ConfigError, match="needs policy.sharing=L2 or L3"):
        cfg("policy.sharing=L1", "policy.groups={a: [tool, reasoner, verifier]}")


@pytest.mark.parametrize("sharing", ["L2", "L3"])
def test_each_policy_of_a_two_plus_one_partition_updates_on_its_roles_only(sharing):
    cfg = load_config(None, FAST + ["env.name=math_verify", "env.style=compact", "env.kwargs={dataset: arithmetic, "
                                    "max_turns: 2}", "model.max_prompt_tokens=256", "warmstart.enabled=false",
                                    "rollout.max_new_tokens=12", f"policy.sharing={sharing}",
                                    "policy.groups={checker: [tool, verifier], solver: [reasoner]}",
                                    "algo.filter_zero_variance=false"])
    state = build_state(cfg)
    assert sorted(state.policies) == ["checker", "solver"] and state.agent_to_policy["verifier"] == "checker"
    seen = {}
    update = state.backend.update

    def spy(st, batches):
        seen.update({pid: {s.agent for s in ss} for pid, ss in batches.items()})
        for ss in batches.values():  # an untrained policy's junk scores the same everywhere: give it a signal
            for i, s in enumerate(ss):
                s.advantage = 1.0 if i % 2 else -1.0
        return update(st, batches)

    state.backend.update = spy
    before = {pid: [p.detach().clone() for p in pol.model.parameters()] for pid, pol in state.policies.items()}
    result = train_step(state, 1)
    assert seen == {"checker": {"tool", "verifier"}, "solver": {"reasoner"}}
    assert all(s.policy == state.agent_to_policy[s.agent] for s in result.samples)
    for pid, pol in state.policies.items():  # each policy trained on exactly its roles' samples
        own = [s for s in result.samples if s.policy == pid]
        assert result.updates[pid].samples == len(own) > 0 and result.updates[pid].optimizer_steps > 0
        moved = any(not torch.equal(a, b) for a, b in zip(before[pid], pol.model.parameters()))
        assert moved, pid


@pytest.mark.slow
def test_ray_backend_runs_three_policies_one_pool_each():
    """Three roles, three policies (L3): the Ray backend starts one rollout and one update pool per policy from
    the configuration alone, and one step equals the local backend's (same seed: same samples and rewards)."""
    ray = pytest.importorskip("ray")
    from atgrpo.trainer.ray.driver import RayBackend

    items = FAST + ["env.name=math_verify", "env.style=compact", "env.kwargs={dataset: arithmetic, max_turns: 2}",
                    "model.max_prompt_tokens=256", "warmstart.enabled=false", "rollout.max_new_tokens=12",
                    "policy.sharing=L3", "system.backend=ray", "system.ray.cpus_per_worker=0.125",
                    "system.ray.cpus_per_env_worker=0.125", "algo.filter_zero_variance=false"]
    cfg = load_config(None, items)
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        backend = RayBackend(cfg)
        try:
            assert sorted(backend.policy_ids) == sorted(TEAM)
            local, remote = build_state(cfg), build_state(cfg)
            remote.backend = backend
            rl, rr = train_step(local, 1), train_step(remote, 1)
            key = [(s.problem, s.turn, s.agent, s.branch, s.response, s.reward) for s in rl.samples]
            assert key == [(s.problem, s.turn, s.agent, s.branch, s.response, s.reward) for s in rr.samples]
            assert {s.policy for s in rr.samples} == set(TEAM)
            for pid in TEAM:
                assert rr.updates[pid].samples == rl.updates[pid].samples > 0
        finally:
            backend.close()
    finally:
        ray.shutdown()
