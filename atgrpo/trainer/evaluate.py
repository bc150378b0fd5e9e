"""Held-out evaluation: one episode per evaluation-split problem, no tree, greedy by default; and loading what
``atgrpo eval`` evaluates (a run directory's final policies, or a config's fresh ones)."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ..config import Config
from ..envs import MultiAgentEnv
from ..policies.protocol import Policy
from ..rollout.records import EpisodeResult
from ..rollout.sampling import Sampling
from ..rollout.tree import tree_rollout
from .checkpoint import load_model_weights
from .eval_target import eval_config
from .atomic_files import verify_dir
from .run_dir import RunError
from .setup import eval_sampling
from .state import TrainState, build_state_checked, check_model_path
from .warmstart import warm_start

EVAL_BATCH = 256  # problems per batched rollout


def evaluate(make_env: Callable[[str, int], MultiAgentEnv], policies: dict[str, Policy],
             agent_to_policy: dict[str, str], problems: int, sampling: Sampling, seed: int = 0
             ) -> tuple[dict[str, float], list[EpisodeResult]]:
    """Metrics (success_rate, mean turns, mean return per agent, and ``solved_by_turn_<t>``: the share solved within
    the first t turns: about what the same policies would score with ``max_turns=t``, though the prompts name the
    turn count) over ``problems`` evaluation problems (seeds 0..problems-1 of the eval split: the
    same set for every run, so runs are comparable), one episode each (``sampling.K`` must be 1)."""
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
    for t in range(1, max((e.turns for e in episodes), default=0)):
        metrics[f"solved_by_turn_{t}"] = sum(e.success and e.turns <= t for e in episodes) / n
    for agent in episodes[0].returns if episodes else []:
        metrics[f"return/{agent}"] = sum(e.returns[agent] for e in episodes) / n
    return metrics, episodes


def run_eval(state: TrainState, seed: int) -> tuple[dict[str, float], list]:
    """Held-out metrics and episodes of the state's policies (``eval.problems`` problems, ``eval_sampling``)."""
    cfg = state.cfg
    return evaluate(state.make_env, state.backend.eval_policies(state), state.agent_to_policy, cfg.eval.problems,
                    eval_sampling(cfg), seed)


def load_policies(state: TrainState, path: str) -> None:
    """Load the weights saved by ``save_policies`` into the state's policies (same config): full models, or
    for L2 each role's adapter (the base model comes from the config)."""
    problem = verify_dir(path)
    if problem:
        raise RunError(f"the saved policies in {path} are {'missing' if problem == 'missing' else 'damaged'}"
                       f"{'' if problem == 'missing' else f' ({problem})'}")
    for pid, policy in state.policies.items():
        d = os.path.join(path, pid)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"no saved policy {pid!r} at {d}; policies of this config: {sorted(state.policies)}")
        load_model_weights(policy.model, d)


def evaluate_target(target: str, overrides: list[str], progress: bool = True) -> dict[str, Any]:
    """``atgrpo eval``: a run directory (its config and final checkpoint) or a config file (fresh policies,
    warm-started if the config says so: the no-RL baselines)."""
    cfg, state = load_eval_state(target, overrides, progress)
    metrics, _ = run_eval(state, cfg.seed)
    return {"target": target, "env": cfg.env.name, "sharing": cfg.policy.sharing, **metrics}


def load_eval_state(target: str, overrides: list[str], progress: bool = True) -> tuple[Config, TrainState]:
    """The config and the policies to evaluate: a run directory's final checkpoint, or a config's fresh
    policies (warm-started if it says so)."""
    cfg = eval_config(target, overrides)
    return cfg, eval_state(target, cfg, progress)


def eval_state(target: str, cfg: Config, progress: bool = True) -> TrainState:
    """The policies ``eval_config``'s target evaluates: the run's final ones, or fresh ones warm-started if the
    config says so (the no-RL baselines)."""
    check_model_path(cfg)
    state = build_state_checked(cfg)
    if os.path.isdir(target):
        load_policies(state, os.path.join(target, "checkpoint", "final"))
    elif cfg.warmstart.enabled and cfg.warmstart.episodes > 0:
        warm_start(state.make_env, state.agent_to_policy, state.policies, cfg.warmstart, cfg.seed, progress)
    return state
