"""The AT-GRPO tree sampler and the trajectory runner (atgrpo/rollout/tree.py) on Plan-Path.

Checked against the method and pitfall 1 of docs/method.md: the K candidates of a node share one pre-state and
prompt, each is stepped on its own copy, their rewards differ when their actions differ, the best is kept
(ties: lowest branch), and the kept state is what the next node sees. Both a scripted stand-in policy (to
control the actions) and real tiny policies are used.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch

from atgrpo.algorithms.advantages import grouped_advantages
from atgrpo.algorithms.grouping import check_group_sizes, group_index, group_key_fn
from atgrpo.envs import make
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from atgrpo.rollout import Sampling, trajectory_rollout, tree_rollout
from scripted import ScriptedBytePolicy

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
ENV_KW = dict(size=5, wall_prob=0.2, max_turns=3)


class ScriptedPolicy(ScriptedBytePolicy):
    """Test double with the policy interface the rollout uses. ``script(prompt_text, n, call, row)`` returns the
    n response texts for one prompt (``call`` counts generate calls, ``row`` is the prompt's index in the call).
    A list script gives branch k the text ``script[k % len(script)]``."""

    def __init__(self, policy_id, script):
        super().__init__(policy_id)
        self.script = script if callable(script) else (lambda prompt, n, call, row: [script[k % len(script)]
                                                                                     for k in range(n)])
        self.calls: list[list[str]] = []

    def render(self, prompt):
        assert isinstance(prompt, str)
        return prompt

    def answers(self, prompts, n):
        self.calls.append(prompts)
        return [self.script(t, n, len(self.calls) - 1, i) for i, t in enumerate(prompts)]


def _envs(seeds, **kw):
    out = []
    for s in seeds:
        e = make("plan_path", **{**ENV_KW, **kw})
        e.reset(s)
        out.append(e)
    return out


def _tiny(policy_id, seed):
    return CausalLMPolicy(policy_id, build_tiny_model(TINY, seed), ByteTokenizer())


def _nodes(samples):
    """problem -> list of nodes in order, each node the list of its K samples (by branch)."""
    by_problem: dict[str, dict[tuple, list]] = defaultdict(dict)
    for s in samples:
        by_problem[s.problem].setdefault((s.turn, s.agent), []).append(s)
    return {p: list(nodes.values()) for p, nodes in by_problem.items()}


def _check_tree(envs, samples, episodes, K, alpha, agent_to_policy):
    """The full set of tree invariants, by replaying the kept trajectory on a fresh copy of each env."""
    keys = [group_key_fn("problem_turn_agent")(s) for s in samples]
    check_group_sizes(keys, K)
    nodes = _nodes(samples)
    assert set(nodes) == {e.problem_id for e in envs}
    assert [ep.problem for ep in episodes] == [e.problem_id for e in envs]
    for env, ep in zip(envs, episodes):
        replay = env.clone()
        transcript = []
        for node in nodes[env.problem_id]:
            s0 = node[0]
            assert [s.branch for s in node] == list(range(K))
            assert (s0.turn, s0.agent) == (replay.turn, replay.current_agent)
            assert all(s.policy == agent_to_policy[s.agent] for s in node)
            # one pre-state, one prompt: the prompt is the observation of the kept state so far
            assert all(s.prompt == s0.prompt and s.prompt_ids == s0.prompt_ids for s in node)
            assert s0.prompt == replay.observe()
            # each candidate scored on its own copy of the pre-state
            expect = []
            for s in node:
                r = replay.clone().step(s.response)
                assert (s.reward_team, s.reward_local) == (r.reward.team, r.reward.local)
                assert s.reward == pytest.approx(alpha * r.reward.team + r.reward.local, abs=1e-12)
                expect.append(s.reward)
            # greedy: exactly one kept, the maximal reward, ties -> the lowest branch index
            best = max(range(K), key=lambda k: (expect[k], -k))
            assert [s.selected for s in node] == [k == best for k in range(K)]
            replay.step(node[best].response)
            transcript.append(node[best].reward)
        assert replay.done  # the tree continued until the episode ended
        assert ep.success == replay.success
        assert [t["reward"] for t in ep.transcript] == transcript
        assert sum(ep.returns.values()) == pytest.approx(sum(transcript))


# ---- scripted candidates ---------------------------------------------------------------------------------
CANDIDATES = ["R", "L", "U", "D", "RRDD", "zz junk"]


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_tree_scripted_candidates(alpha):
    envs = _envs(range(5))
    snapshots = [copy.deepcopy(vars(e)) for e in envs]
    pol = ScriptedPolicy("shared", CANDIDATES)
    K = len(CANDIDATES)
    samples, episodes = tree_rollout(envs, {"shared": pol}, {"tool": "shared", "plan": "shared"}, Sampling(K=K,
                                     temperature=1.0, max_new_tokens=8, alpha=alpha))
    _check_tree(envs, samples, episodes, K, alpha, {"tool": "shared", "plan": "shared"})
    # the envs passed in are never mutated
    assert [vars(e) for e in envs] == snapshots
    assert all(e.turn == 0 and not e.done for e in envs)
    # candidates that differ get rewards that differ, for both agents (no scoring on a shared copy)
    for nodes in _nodes(samples).values():
        for node in nodes:
            assert [s.response for s in node] == CANDIDATES
            assert len({round(s.reward, 9) for s in node}) >= 3, [(s.response, s.reward) for s in node]
    # all problems advance in lockstep: one generate call per (turn, agent) node, batching all live problems
    assert len(pol.calls[0]) == len(envs)


def test_plan_agent_rewards_differ_and_are_not_copies_of_tool_best():
    """Pitfall 1 (docs/method.md): agent 2's K samples scored on a copy of agent 1's best branch get identical rewards."""
    envs = _envs([0, 1, 2])
    tool = ScriptedPolicy("tool", ["zz", "RRDD", "D", "zz", "R"])
    plan = ScriptedPolicy("plan", ["R", "L", "U", "D", "zz"])
    samples, episodes = tree_rollout(envs, {"tool": tool, "plan": plan}, {"tool": "tool", "plan": "plan"},
                                     Sampling(K=5, temperature=1.0, max_new_tokens=8, alpha=1.0))
    _check_tree(envs, samples, episodes, 5, 1.0, {"tool": "tool", "plan": "plan"})
    plan_nodes = [n for nodes in _nodes(samples).values() for n in nodes if n[0].agent == "plan"]
    assert plan_nodes
    for node in plan_nodes:
        rewards = [s.reward for s in node]
        # junk, an invalid or away move, and a move toward the goal: at least three different rewards
        assert len(set(rewards)) >= 3, rewards
        assert all(s.info["moves"] == (s.response if s.response != "zz" else "") for s in node)
    # routing: every sample went to the policy of its agent
    assert {s.policy for s in samples if s.agent == "tool"} == {"tool"}
    assert {s.policy for s in samples if s.agent == "plan"} == {"plan"}


def test_tie_break_lowest_branch_and_next_prompt_follows_kept_state():
    env = _envs([3])[0]
    # rank two different move lists by their reward from the current state, computed independently
    options = ["R", "L", "U", "D", "RR", "DD", "UU", "LL"]
    scored = sorted(options, key=lambda t: env.clone().step(t).reward.total(1.0))
    worst, best = scored[0], scored[-1]
    assert env.clone().step(worst).reward.total(1.0) < env.clone().step(best).reward.total(1.0)
    cands = [worst, best, best, worst]
    pol = ScriptedPolicy("shared", cands)
    samples, episodes = tree_rollout([env], {"shared": pol}, {"tool": "shared", "plan": "shared"}, Sampling(K=4,
                                     temperature=1.0, max_new_tokens=8, alpha=1.0))
    first = samples[:4]
    assert [s.selected for s in first] == [False, True, False, False]
    assert first[1].reward == first[2].reward
    _check_tree([env], samples, episodes, 4, 1.0, {"tool": "shared", "plan": "shared"})
    # identical candidates everywhere: branch 0 is kept at every node
    samples, _ = tree_rollout([env], {"shared": ScriptedPolicy("shared", ["RD"])},
                              {"tool": "shared", "plan": "shared"}, Sampling(K=3, temperature=1.0, max_new_tokens=8,
                              alpha=1.0))
    assert all(s.selected == (s.branch == 0) for s in samples)


def test_next_prompt_shows_selected_position():
    """After the plan node, the next tool prompt shows the position reached by the kept plan candidate."""
    env = _envs([4])[0]
    plan = ScriptedPolicy("p", ["zz", "D", "R", "U", "L"])
    tool = ScriptedPolicy("t", ["zz"] * 5)
    samples, _ = tree_rollout([env], {"t": tool, "p": plan}, {"tool": "t", "plan": "p"}, Sampling(K=5,
                              temperature=1.0, max_new_tokens=8, alpha=1.0))
    nodes = _nodes(samples)[env.problem_id]
    assert len(nodes) >= 3, "problem 4 must not be solved in turn 0 for this test"
    tool0, plan0, tool1 = nodes[0], nodes[1], nodes[2]
    kept = next(s for s in plan0 if s.selected)
    after = env.clone()
    after.step(next(s for s in tool0 if s.selected).response)
    pos_before = after.pos
    after.step(kept.response)
    assert tool1[0].prompt.splitlines()[0].startswith(f"T1 A{after.pos[0]},{after.pos[1]} G{env.goal[0]},{env.goal[1]} ")
    best_reward = max(s.reward for s in plan0)
    assert kept.reward == best_reward
    # on this problem the kept move really moves the planner, so a prompt showing the old position would fail
    assert after.pos != pos_before
    assert f"A{pos_before[0]},{pos_before[1]}" not in tool1[0].prompt.splitlines()[0]


def test_expert_candidate_solves_and_ends_episode():
    envs = _envs([0, 1, 2, 3])
    # the script answers each prompt with junk, then the BFS path of the grid shown in the prompt (the grid
    # rows mark the current position; the tool's simulation does not move it)
    size = envs[0].size
    expert = {tuple(e.observe("tool").splitlines()[1:1 + size]): e.expert_action("tool") for e in envs}
    assert len(expert) == len(envs)

    def script(prompt, n, call, row):
        return ["zz"] + [expert.get(tuple(prompt.splitlines()[1:1 + size]), "zz")] * (n - 1)

    tool = ScriptedPolicy("t", script)
    plan = ScriptedPolicy("p", script)
    samples, episodes = tree_rollout(envs, {"t": tool, "p": plan}, {"tool": "t", "plan": "p"}, Sampling(K=3,
                                     temperature=1.0, max_new_tokens=8, alpha=1.0))
    _check_tree(envs, samples, episodes, 3, 1.0, {"tool": "t", "plan": "p"})
    assert all(ep.success and ep.turns == 1 for ep in episodes)
    assert len(samples) == len(envs) * 2 * 3  # one turn, two agents, K = 3
    for s in samples:
        assert s.selected == (s.branch == 1)
        if s.agent == "plan" and s.branch > 0:
            assert s.reward_team == 1.0 and s.reward == pytest.approx(1.0 + s.reward_local)


def test_unknown_agent_raises():
    envs = _envs([0])
    with pytest.raises(KeyError, match="tool"):
        tree_rollout(envs, {"p": ScriptedPolicy("p", ["R"])}, {"plan": "p"}, Sampling(K=2, temperature=1.0,
                     max_new_tokens=4, alpha=1.0))


# ---- real tiny policies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sharing", ["L1", "L3"])
def test_tree_real_policies(sharing):
    envs = _envs(range(4))
    snapshots = [copy.deepcopy(vars(e)) for e in envs]
    if sharing == "L1":
        policies = {"shared": _tiny("shared", 0)}
        a2p = {"tool": "shared", "plan": "shared"}
    else:
        policies = {"tool_pol": _tiny("tool_pol", 1), "plan_pol": _tiny("plan_pol", 2)}
        a2p = {"tool": "tool_pol", "plan": "plan_pol"}
    K, T = 4, 1.0
    samples, episodes = tree_rollout(envs, policies, a2p, Sampling(K=K, temperature=T, max_new_tokens=8, alpha=0.7),
                                     generator=torch.Generator().manual_seed(0))
    _check_tree(envs, samples, episodes, K, 0.7, a2p)
    assert [vars(e) for e in envs] == snapshots
    # candidates of a node are independent samples; their stored log-probs are the policy's own
    assert any(len({tuple(s.response_ids) for s in node}) > 1 for nodes in _nodes(samples).values()
               for node in nodes)
    for pid, pol in policies.items():
        mine = [s for s in samples if s.policy == pid]
        assert mine
        with torch.no_grad():
            logp, mask = pol.response_logprobs([s.prompt_ids for s in mine], [s.response_ids for s in mine], T)
        for i, s in enumerate(mine):
            assert len(s.logprobs) == len(s.response_ids) == int(mask[i].sum())
            assert torch.allclose(logp[i, :len(s.logprobs)], torch.tensor(s.logprobs), atol=1e-4)
            assert s.prompt_ids == pol.encode(s.prompt)


# ---- trajectory mode -------------------------------------------------------------------------------------
def test_trajectory_rollout_scripted():
    envs = _envs(range(3))
    snapshots = [copy.deepcopy(vars(e)) for e in envs]
    K = 4
    moves = ["R", "D", "L", "U", "zz", "RD", "DR", "LU"]
    # a different action for every call and row, so the K trajectories differ
    counter = iter(range(10_000))
    pol = ScriptedPolicy("shared", lambda prompt, n, call, row: [moves[next(counter) % len(moves)] for _ in range(n)])
    samples, episodes = trajectory_rollout(envs, {"shared": pol}, {"tool": "shared", "plan": "shared"}, Sampling(K=K,
                                           temperature=1.0, max_new_tokens=8, alpha=1.0))
    assert [vars(e) for e in envs] == snapshots
    assert len(episodes) == len(envs) * K
    assert [ep.problem for ep in episodes] == [e.problem_id for e in envs for _ in range(K)]  # problem-major
    traj: dict[tuple, list] = defaultdict(list)
    for s in samples:
        traj[(s.problem, s.branch)].append(s)
    assert set(traj) == {(e.problem_id, k) for e in envs for k in range(K)}
    for j, ep in enumerate(episodes):
        env, k = envs[j // K], j % K
        own = traj[(env.problem_id, k)]
        total = sum(s.reward for s in own)
        assert all(s.selected for s in own)
        assert all(s.episode_return == pytest.approx(total) for s in own)
        assert sum(ep.returns.values()) == pytest.approx(total)
        # the trajectory is one episode: replay it on a fresh copy
        replay = env.clone()
        for s in own:
            assert s.prompt == replay.observe()
            r = replay.step(s.response)
            assert s.reward == pytest.approx(r.reward.total(1.0))
        assert replay.done and ep.success == replay.success
    # the K trajectories of a problem are independent episodes: after turn 0 their prompts differ
    for env in envs:
        later = {s.prompt for k in range(K) for s in traj[(env.problem_id, k)] if (s.turn, s.agent) == (0, "plan")}
        assert len(later) > 1


def test_trajectory_rollout_real_policy():
    envs = _envs(range(2))
    pol = _tiny("shared", 0)
    K = 3
    samples, episodes = trajectory_rollout(envs, {"shared": pol}, {"tool": "shared", "plan": "shared"}, Sampling(K=K,
                                           temperature=1.0, max_new_tokens=6, alpha=1.0),
                                           generator=torch.Generator().manual_seed(1))
    assert len(episodes) == len(envs) * K
    for j, ep in enumerate(episodes):
        own = [s for s in samples if s.problem == envs[j // K].problem_id and s.branch == j % K]
        assert own and len(own) == len(ep.transcript)
        assert all(s.episode_return == pytest.approx(sum(x.reward for x in own)) for s in own)
        assert [t["response"] for t in ep.transcript] == [s.response for s in own]


# ---- single agent, single turn = plain GRPO --------------------------------------------------------------
def _advantages(samples, key_name):
    keys = [group_key_fn(key_name)(s) for s in samples]
    ids, uniq = group_index(keys)
    adv, _ = grouped_advantages(torch.tensor([s.reward for s in samples]), torch.tensor(ids))
    return keys, uniq, adv


@pytest.mark.parametrize("real", [False, True])
def test_single_agent_single_turn_is_plain_grpo(real):
    envs = _envs(range(3), roles=("plan",), max_turns=1)
    K = 4
    cands = ["R", "zz", "DD", "LU"]
    # branch k answers cands[k]: in the tree (n = K per prompt) and in trajectory mode (n = 1, row = p * K + k)
    pol = _tiny("solo", 0) if real else ScriptedPolicy(
        "solo", lambda prompt, n, call, row: [cands[row % K]] if n == 1 else cands[:n])
    samples, episodes = tree_rollout(envs, {"solo": pol}, {"plan": "solo"}, Sampling(K=K, temperature=1.0,
                                     max_new_tokens=6, alpha=1.0), generator=torch.Generator().manual_seed(2))
    assert len(samples) == len(envs) * K
    keys, uniq, adv = _advantages(samples, "problem_turn_agent")
    keys_p, uniq_p, adv_p = _advantages(samples, "problem")
    check_group_sizes(keys, K)
    check_group_sizes(keys_p, K)
    assert len(uniq) == len(uniq_p) == len(envs)
    assert [k[0] for k in uniq] == [k[0] for k in uniq_p] == [e.problem_id for e in envs]
    assert torch.equal(adv, adv_p)
    if not real:
        assert (adv != 0).any()
    # and the trajectory runner gives the same groups (K independent single-step episodes per problem)
    t_samples, _ = trajectory_rollout(envs, {"solo": pol}, {"plan": "solo"}, Sampling(K=K, temperature=1.0,
                                      max_new_tokens=6, alpha=1.0), generator=torch.Generator().manual_seed(2))
    t_keys, t_uniq, t_adv = _advantages(t_samples, "problem_turn_agent")
    check_group_sizes(t_keys, K)
    assert t_uniq == uniq
    if not real:  # scripted: identical candidates, identical rewards and advantages
        assert [s.reward for s in t_samples] == [s.reward for s in samples]
        assert torch.equal(t_adv, adv)
