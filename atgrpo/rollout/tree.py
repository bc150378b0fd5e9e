"""The AT-GRPO tree sampler (docs/method.md), and the plain multi-episode runner built on the same loop.

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

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence

from ..envs.base import MultiAgentEnv, StepResult
from .records import EpisodeResult, Sample
from .sampling import Sampling, cut_at_stop

if TYPE_CHECKING:  # annotations only: environment workers import this module without torch / transformers
    import torch

    from ..policies.protocol import Policy

# (pre-state envs, K texts per env) -> per env (K stepped children, their K results): see ``step_clones``
StepEnvs = Callable[[Sequence[MultiAgentEnv], Sequence[Sequence[str]]],
                    list[tuple[list[MultiAgentEnv], list[StepResult]]]]


def _policy_for(agent: str, agent_to_policy: dict[str, str], policies: dict[str, Policy]) -> Policy:
    if agent not in agent_to_policy:
        raise KeyError(f"agent {agent!r} has no policy; agent_to_policy maps {sorted(agent_to_policy)}")
    return policies[agent_to_policy[agent]]


def tree_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, Policy], agent_to_policy: dict[str, str],
                 sampling: Sampling, generator: torch.Generator | None = None, step_envs: StepEnvs | None = None
                 ) -> tuple[list[Sample], list[EpisodeResult]]:
    """Tree-sample one episode per env (each already reset to its problem; the envs are not mutated), K
    candidates per node. Returns all samples (``Sample.score``: the candidate's immediate reward) and one
    EpisodeResult per problem (its kept trajectory). ``step_envs``: where the candidates are stepped (default
    ``step_clones``: here; the Ray backend: environment workers)."""
    samples, episodes, _ = _run(envs, policies, agent_to_policy, sampling, generator, step_envs)
    return samples, episodes


def trajectory_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, Policy],
                       agent_to_policy: dict[str, str], sampling: Sampling, generator: torch.Generator | None = None,
                       step_envs: StepEnvs | None = None) -> tuple[list[Sample], list[EpisodeResult]]:
    """K independent episodes per env (no tree). ``Sample.branch`` is the trajectory index, and
    ``Sample.episode_return`` and ``Sample.score`` the summed reward of its trajectory over all agents.
    Episodes: P*K, in order problem-major."""
    K = sampling.K
    copies = [e.clone() for e in envs for _ in range(K)]
    samples, episodes, origin = _run(copies, policies, agent_to_policy, dataclasses.replace(sampling, K=1),
                                     generator, step_envs)
    for s, j in zip(samples, origin):
        s.branch = j % K
        s.episode_return = s.score = sum(episodes[j].returns.values())
    return samples, episodes


def step_clones(envs: Sequence[MultiAgentEnv], texts: Sequence[Sequence[str]]
                ) -> list[tuple[list[MultiAgentEnv], list[StepResult]]]:
    """Candidate k of ``envs[i]`` is ``texts[i][k]``, stepped on its own clone of ``envs[i]`` (which is not
    mutated). Returns per env ``(children, results)``; the Ray backend runs the same on environment workers."""
    out = []
    for env, ts in zip(envs, texts):
        children = [env.clone() for _ in ts]
        out.append((children, [child.step(t) for child, t in zip(children, ts)]))
    return out


def _run(envs, policies, agent_to_policy, sampling: Sampling, generator, step_envs=None):
    """The node loop shared by both rollouts; also returns, per sample, the index of the env it came from."""
    envs, step_envs = list(envs), step_envs or step_clones
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
        temp, max_new, stop = sampling.for_agent(agent)
        completions = policy.generate(prompt_ids, sampling.K, temp, max_new, generator)
        if stop:
            completions = [[cut_at_stop(c, stop, policy.decode) for c in comps] for comps in completions]
        stepped = step_envs([envs[i] for i in active], [[c.text for c in comps] for comps in completions])
        for i, prompt, pids, comps, (children, results) in zip(active, prompts, prompt_ids, completions, stepped):
            totals = [r.reward.total(sampling.alpha) for r in results]
            best = max(range(sampling.K), key=lambda k: (totals[k], -k))
            for k, (c, r) in enumerate(zip(comps, results)):
                samples.append(Sample(
                    problem=envs[i].problem_id, branch=k, turn=turn, agent=agent, policy=policy.policy_id,
                    prompt=prompt, prompt_ids=pids, response=c.text, response_ids=c.ids, logprobs=c.logprobs,
                    reward_team=r.reward.team, reward_local=r.reward.local, reward=totals[k], score=totals[k],
                    selected=k == best, finished=c.finished, info=r.info, temperature=temp))
                origin.append(i)
            returns[i][agent] += totals[best]
            transcripts[i].append({"turn": turn, "agent": agent, "prompt": prompt, "response": comps[best].text,
                                   "reward": totals[best], "team": results[best].reward.team,
                                   "local": results[best].reward.local})
            envs[i] = children[best]
    episodes = [EpisodeResult(e.problem_id, e.success, len(tr) // max(1, len(e.agents)) + (len(tr) % len(e.agents) > 0),
                              ret, tr) for e, ret, tr in zip(envs, returns, transcripts)]
    return samples, episodes, origin
