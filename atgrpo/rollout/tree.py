"""The AT-GRPO tree sampler (REFERENCE section 2), and the plain multi-episode runner built on the same loop.

For each problem, each turn, each agent in turn order: sample K candidates from the acting agent's policy,
all from the identical pre-state and prompt; step each candidate on its *own clone* of the environment and
score it by its immediate reward ``alpha * team + local``; keep the best (tie-break: the lowest branch index;
branches are i.i.d. samples, so this is a uniformly random choice among the tied); the winner's state becomes
the state of all branches. All active problems are in lockstep, so each (turn, agent) node costs one batched
``generate`` over all problems and branches of the acting policy.

``K = 1`` with ``temperature = 0`` is plain greedy evaluation; ``trajectory_rollout`` runs K independent
episodes per problem (classic trajectory-level GRPO and the no-tree baselines).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..envs.base import MultiAgentEnv
from ..policies.causal_lm import CausalLMPolicy
from .records import EpisodeResult, Sample


def _policy_for(agent: str, agent_to_policy: dict[str, str], policies: dict[str, CausalLMPolicy]) -> CausalLMPolicy:
    if agent not in agent_to_policy:
        raise KeyError(f"agent {agent!r} has no policy; agent_to_policy maps {sorted(agent_to_policy)}")
    return policies[agent_to_policy[agent]]


def tree_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, CausalLMPolicy], agent_to_policy: dict[str, str],
                 K: int, temperature: float, max_new_tokens: int, alpha: float,
                 generator: torch.Generator | None = None) -> tuple[list[Sample], list[EpisodeResult]]:
    """Tree-sample one episode per env (each already reset to its problem; the envs are not mutated).
    Returns all K-per-node samples and one EpisodeResult per problem (its kept trajectory)."""
    samples, episodes, _ = _run(envs, policies, agent_to_policy, K, temperature, max_new_tokens, alpha, generator)
    return samples, episodes


def trajectory_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, CausalLMPolicy],
                       agent_to_policy: dict[str, str], K: int, temperature: float, max_new_tokens: int,
                       alpha: float, generator: torch.Generator | None = None
                       ) -> tuple[list[Sample], list[EpisodeResult]]:
    """K independent episodes per env (no tree). ``Sample.branch`` is the trajectory index and
    ``Sample.episode_return`` the summed reward of its trajectory over all agents. Episodes: P*K, in order
    problem-major."""
    copies = [e.clone() for e in envs for _ in range(K)]
    samples, episodes, origin = _run(copies, policies, agent_to_policy, 1, temperature, max_new_tokens, alpha,
                                     generator)
    for s, j in zip(samples, origin):
        s.branch = j % K
        s.episode_return = sum(episodes[j].returns.values())
    return samples, episodes


def _run(envs, policies, agent_to_policy, K, temperature, max_new_tokens, alpha, generator):
    """The node loop shared by both rollouts; also returns, per sample, the index of the env it came from."""
    envs = list(envs)
    samples: list[Sample] = []
    origin: list[int] = []
    transcripts: list[list[dict]] = [[] for _ in envs]
    returns: list[dict[str, float]] = [{a: 0.0 for a in e.agents} for e in envs]
    while True:
        active = [i for i, e in enumerate(envs) if not e.done]
        if not active:
            break
        agent, turn = envs[active[0]].current_agent, envs[active[0]].turn
        assert all(envs[i].current_agent == agent and envs[i].turn == turn for i in active), "envs out of lockstep"
        policy = _policy_for(agent, agent_to_policy, policies)
        prompts = [policy.render(envs[i].observe()) for i in active]
        prompt_ids = [policy.encode(p) for p in prompts]
        completions = policy.generate(prompt_ids, K, temperature, max_new_tokens, generator)
        for i, prompt, pids, comps in zip(active, prompts, prompt_ids, completions):
            children = [envs[i].clone() for _ in range(K)]  # each candidate on its own copy of the pre-state
            results = [child.step(c.text) for child, c in zip(children, comps)]
            totals = [r.reward.total(alpha) for r in results]
            best = max(range(K), key=lambda k: (totals[k], -k))
            for k, (c, r) in enumerate(zip(comps, results)):
                samples.append(Sample(
                    problem=envs[i].problem_id, branch=k, turn=turn, agent=agent, policy=policy.policy_id,
                    prompt=prompt, prompt_ids=pids, response=c.text, response_ids=c.ids, logprobs=c.logprobs,
                    reward_team=r.reward.team, reward_local=r.reward.local, reward=totals[k], selected=k == best,
                    finished=c.finished, info=r.info))
                origin.append(i)
            returns[i][agent] += totals[best]
            transcripts[i].append({"turn": turn, "agent": agent, "prompt": prompt, "response": comps[best].text,
                                   "reward": totals[best], "team": results[best].reward.team,
                                   "local": results[best].reward.local})
            envs[i] = children[best]
    episodes = [EpisodeResult(e.problem_id, e.success, len(tr) // max(1, len(e.agents)) + (len(tr) % len(e.agents) > 0),
                              ret, tr) for e, ret, tr in zip(envs, returns, transcripts)]
    return samples, episodes, origin
