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
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..envs.base import MultiAgentEnv, StepResult
from .records import EpisodeResult, Sample

if TYPE_CHECKING:  # annotations only: environment workers import this module without torch / transformers
    import torch

    from ..policies.causal_lm import CausalLMPolicy

# (pre-state envs, K texts per env) -> per env (K stepped children, their K results): see ``step_clones``
StepEnvs = Callable[[Sequence[MultiAgentEnv], Sequence[Sequence[str]]],
                    list[tuple[list[MultiAgentEnv], list[StepResult]]]]
# agent -> its own sampling settings (rollout.per_agent): any of temperature, max_new_tokens, stop (strings)
PerAgent = Mapping[str, Mapping[str, Any]]


def agent_sampling(agent: str, per_agent: PerAgent | None, temperature: float, max_new_tokens: int
                   ) -> tuple[float, int, tuple[str, ...]]:
    """(temperature, max_new_tokens, stop strings) of ``agent``: its ``per_agent`` entry over the defaults."""
    own = (per_agent or {}).get(agent) or {}
    stop = own.get("stop") or ()
    return (float(own.get("temperature", temperature)), int(own.get("max_new_tokens", max_new_tokens)),
            (stop,) if isinstance(stop, str) else tuple(stop))


def cut_at_stop(completion, stop: Sequence[str], decode: Callable[[list[int]], str]):
    """The completion up to and including the first token that completes a stop string (a new ``Completion``
    marked finished: its ids, log-probs and text are that prefix), or ``completion`` unchanged when no stop
    string occurs. Log-probs of a prefix do not depend on what follows, so the stored ones stay exact."""
    if not stop or not any(t in completion.text for t in stop):
        return completion
    ids = completion.ids
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string (monotone in the prefix length)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(t in decode(ids[:mid]) for t in stop):
            hi = mid
        else:
            lo = mid + 1
    return dataclasses.replace(completion, ids=list(ids[:lo]), logprobs=list(completion.logprobs[:lo]),
                               text=decode(ids[:lo]), finished=True)


def _policy_for(agent: str, agent_to_policy: dict[str, str], policies: dict[str, CausalLMPolicy]) -> CausalLMPolicy:
    if agent not in agent_to_policy:
        raise KeyError(f"agent {agent!r} has no policy; agent_to_policy maps {sorted(agent_to_policy)}")
    return policies[agent_to_policy[agent]]


def tree_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, CausalLMPolicy], agent_to_policy: dict[str, str],
                 K: int, temperature: float, max_new_tokens: int, alpha: float,
                 generator: torch.Generator | None = None, step_envs: StepEnvs | None = None,
                 per_agent: PerAgent | None = None) -> tuple[list[Sample], list[EpisodeResult]]:
    """Tree-sample one episode per env (each already reset to its problem; the envs are not mutated).
    Returns all K-per-node samples and one EpisodeResult per problem (its kept trajectory). ``step_envs``:
    where the candidates are stepped (default ``step_clones``: here; the Ray backend: environment workers).
    ``per_agent``: an agent's own temperature / max_new_tokens / stop strings (``agent_sampling``)."""
    samples, episodes, _ = _run(envs, policies, agent_to_policy, K, temperature, max_new_tokens, alpha, generator,
                                step_envs, per_agent)
    return samples, episodes


def trajectory_rollout(envs: Sequence[MultiAgentEnv], policies: dict[str, CausalLMPolicy],
                       agent_to_policy: dict[str, str], K: int, temperature: float, max_new_tokens: int,
                       alpha: float, generator: torch.Generator | None = None, step_envs: StepEnvs | None = None,
                       per_agent: PerAgent | None = None) -> tuple[list[Sample], list[EpisodeResult]]:
    """K independent episodes per env (no tree). ``Sample.branch`` is the trajectory index and
    ``Sample.episode_return`` the summed reward of its trajectory over all agents. Episodes: P*K, in order
    problem-major."""
    copies = [e.clone() for e in envs for _ in range(K)]
    samples, episodes, origin = _run(copies, policies, agent_to_policy, 1, temperature, max_new_tokens, alpha,
                                     generator, step_envs, per_agent)
    for s, j in zip(samples, origin):
        s.branch = j % K
        s.episode_return = sum(episodes[j].returns.values())
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


def _run(envs, policies, agent_to_policy, K, temperature, max_new_tokens, alpha, generator, step_envs=None,
         per_agent=None):
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
        temp, max_new, stop = agent_sampling(agent, per_agent, temperature, max_new_tokens)
        completions = policy.generate(prompt_ids, K, temp, max_new, generator)
        if stop:
            completions = [[cut_at_stop(c, stop, policy.decode) for c in comps] for comps in completions]
        stepped = step_envs([envs[i] for i in active], [[c.text for c in comps] for comps in completions])
        for i, prompt, pids, comps, (children, results) in zip(active, prompts, prompt_ids, completions, stepped):
            totals = [r.reward.total(alpha) for r in results]
            best = max(range(K), key=lambda k: (totals[k], -k))
            for k, (c, r) in enumerate(zip(comps, results)):
                samples.append(Sample(
                    problem=envs[i].problem_id, branch=k, turn=turn, agent=agent, policy=policy.policy_id,
                    prompt=prompt, prompt_ids=pids, response=c.text, response_ids=c.ids, logprobs=c.logprobs,
                    reward_team=r.reward.team, reward_local=r.reward.local, reward=totals[k], selected=k == best,
                    finished=c.finished, info=r.info, temperature=temp))
                origin.append(i)
            returns[i][agent] += totals[best]
            transcripts[i].append({"turn": turn, "agent": agent, "prompt": prompt, "response": comps[best].text,
                                   "reward": totals[best], "team": results[best].reward.team,
                                   "local": results[best].reward.local})
            envs[i] = children[best]
    episodes = [EpisodeResult(e.problem_id, e.success, len(tr) // max(1, len(e.agents)) + (len(tr) % len(e.agents) > 0),
                              ret, tr) for e, ret, tr in zip(envs, returns, transcripts)]
    return samples, episodes, origin
