"""The AT-GRPO tree sampler (docs/method.md), and the plain multi-episode runner built on the same loop.

For each problem, each turn, each agent in turn order: sample K candidates from the acting agent's policy,
all from the identical pre-state and prompt; step each candidate on its *own clone* of the environment and
score it by its immediate reward ``alpha * team + local``; keep the best (tie-break: the lowest branch index;
branches are i.i.d. samples, so this is a uniformly random choice among the tied); the winner's state becomes
the state of all branches. Each round, the active problems are grouped by their acting agent (an environment
may choose its next agent from its state, so problems of one batch can be at different agents and turns), and
each agent's group costs one batched ``generate`` over its problems and branches; with a fixed turn order all
problems stay in lockstep and each (turn, agent) node is one call.

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


@dataclasses.dataclass
class _Rollout:
    """What the node loop builds: the kept state of each problem, and per problem its transcript and returns;
    the samples and, per sample, the index of the env it came from."""
    envs: list[MultiAgentEnv]
    samples: list[Sample] = dataclasses.field(default_factory=list)
    origin: list[int] = dataclasses.field(default_factory=list)
    transcripts: list[list[dict]] = dataclasses.field(default_factory=list)
    returns: list[dict[str, float]] = dataclasses.field(default_factory=list)


def _run(envs, policies, agent_to_policy, sampling: Sampling, generator, step_envs=None):
    """The node loop shared by both rollouts; also returns, per sample, the index of the env it came from."""
    run = _Rollout(list(envs), transcripts=[[] for _ in envs], returns=[{a: 0.0 for a in e.agents} for e in envs])
    while True:
        by_agent: dict[str, list[int]] = {}  # the active problems by acting agent, agents in order of first appearance
        for i, e in enumerate(run.envs):
            if not e.done:
                by_agent.setdefault(e.current_agent, []).append(i)
        if not by_agent:
            break
        for agent, active in by_agent.items():
            _node(run, active, agent, _policy_for(agent, agent_to_policy, policies), sampling, generator,
                  step_envs or step_clones)
    episodes = [EpisodeResult(e.problem_id, e.success, len({t["turn"] for t in tr}), ret, tr)
                for e, ret, tr in zip(run.envs, run.returns, run.transcripts)]
    return run.samples, episodes, run.origin


def _node(run: _Rollout, active: list[int], agent: str, policy: Policy, sampling: Sampling, generator,
          step_envs: StepEnvs) -> None:
    """One node for the problems ``active``, all at ``agent``: K candidates each from one batched ``generate``,
    each stepped on its own clone, the best kept (``run.envs[i]`` becomes its child); ``run`` grows in place."""
    envs = run.envs
    prompts = [policy.render(envs[i].observe()) for i in active]
    prompt_ids = [policy.encode(p) for p in prompts]
    temp, max_new, stop = sampling.for_agent(agent)
    completions = policy.generate(prompt_ids, sampling.K, temp, max_new, generator)
    if stop:
        completions = [[cut_at_stop(c, stop, policy.decode) for c in comps] for comps in completions]
    stepped = step_envs([envs[i] for i in active], [[c.text for c in comps] for comps in completions])
    for i, prompt, pids, comps, (children, results) in zip(active, prompts, prompt_ids, completions, stepped):
        turn = envs[i].turn
        totals = [r.reward.total(sampling.alpha) for r in results]
        best = max(range(sampling.K), key=lambda k: (totals[k], -k))
        for k, (c, r) in enumerate(zip(comps, results)):
            run.samples.append(Sample(
                problem=envs[i].problem_id, branch=k, turn=turn, agent=agent, policy=policy.policy_id,
                prompt=prompt, prompt_ids=pids, response=c.text, response_ids=c.ids, logprobs=c.logprobs,
                reward_team=r.reward.team, reward_local=r.reward.local, reward=totals[k], score=totals[k],
                selected=k == best, finished=c.finished, info=r.info, temperature=temp,
                trainer_logprobs=c.trainer_logprobs))
            run.origin.append(i)
        run.returns[i][agent] += totals[best]
        run.transcripts[i].append({"turn": turn, "agent": agent, "prompt": prompt, "response": comps[best].text,
                               "reward": totals[best], "team": results[best].reward.team,
                               "local": results[best].reward.local})
        envs[i] = children[best]
