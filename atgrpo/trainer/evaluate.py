"""Held-out evaluation: one episode per evaluation-split problem, no tree, greedy by default."""

from __future__ import annotations

from typing import Callable

import torch

from ..envs import MultiAgentEnv
from ..policies.protocol import Policy
from ..rollout.records import EpisodeResult
from ..rollout.sampling import Sampling
from ..rollout.tree import tree_rollout

EVAL_BATCH = 256  # problems per batched rollout


def evaluate(make_env: Callable[[str, int], MultiAgentEnv], policies: dict[str, Policy],
             agent_to_policy: dict[str, str], problems: int, sampling: Sampling, seed: int = 0
             ) -> tuple[dict[str, float], list[EpisodeResult]]:
    """Metrics (success_rate, mean turns, mean return per agent) over ``problems`` evaluation problems
    (seeds 0..problems-1 of the eval split: the same set for every run, so runs are comparable), one episode
    each (``sampling.K`` must be 1)."""
    if sampling.K != 1:
        raise ValueError(f"evaluation runs one episode per problem (sampling.K=1), not K={sampling.K}")
    gen = torch.Generator().manual_seed(seed)
    episodes: list[EpisodeResult] = []
    for start in range(0, problems, EVAL_BATCH):
        envs = [make_env("eval", s) for s in range(start, min(problems, start + EVAL_BATCH))]
        _, eps = tree_rollout(envs, policies, agent_to_policy, sampling, gen)
        episodes.extend(eps)
    n = max(1, len(episodes))
    metrics = {"success_rate": sum(e.success for e in episodes) / n,
               "turns": sum(e.turns for e in episodes) / n, "problems": float(len(episodes))}
    for agent in episodes[0].returns if episodes else []:
        metrics[f"return/{agent}"] = sum(e.returns[agent] for e in episodes) / n
    return metrics, episodes
