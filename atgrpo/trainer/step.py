"""The AT-GRPO train step, read top to bottom: rollout -> advantages -> update per policy -> metrics.

Strictly on-policy and synchronous (docs/method.md): every policy is updated on the samples it generated
in this step's rollout, and the next rollout uses the new weights (same objects: no sync needed locally).
Where the work runs is the backend's business (``state.backend``): ``LocalBackend`` here, in this process;
``ray.driver.RayBackend`` on Ray actors (docs/ray.md). The step is the same code for both.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithms.advantages import grouped_advantages
from ..algorithms.grouping import check_group_sizes, group_index, group_key_fn, key_str
from ..config import Config
from ..envs import MultiAgentEnv
from ..policies.causal_lm import CausalLMPolicy
from ..rollout.records import EpisodeResult, Sample
from ..rollout.tree import step_clones, trajectory_rollout, tree_rollout
from .setup import problem_seed
from .update import update_policy


class LocalBackend:
    """Everything in this process: the policies generate and train here, the environments step here."""

    def rollout_policies(self, state: "TrainState") -> dict[str, CausalLMPolicy]:
        return state.policies

    def step_envs(self, envs, texts):
        return step_clones(envs, texts)

    def update(self, state: "TrainState", batches: dict[str, list[Sample]]) -> dict[str, Any]:
        cfg = state.cfg
        return {pid: update_policy(state.policies[pid], state.optimizers[pid], batch, cfg.algo,
                                   cfg.rollout.temperature, state.generator, state.references.get(pid))
                for pid, batch in batches.items()}

    def step_metrics(self) -> dict[str, float]:
        return {}

    def pull_state(self, state: "TrainState") -> None:  # before a checkpoint: the state is already here
        pass

    def close(self) -> None:
        pass


@dataclass
class TrainState:
    cfg: Config
    make_env: Callable[[str, int], MultiAgentEnv]
    agent_map: dict[str, str]
    policies: dict[str, CausalLMPolicy]
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator  # all sampling and shuffling randomness of the loop
    references: dict[str, CausalLMPolicy] = field(default_factory=dict)  # frozen, for the KL penalty
    step: int = 0
    backend: Any = field(default_factory=LocalBackend)  # where rollout, env steps and updates run


def rollout(state: TrainState, step: int) -> tuple[list[Sample], list[EpisodeResult]]:
    cfg = state.cfg
    P = cfg.rollout.problems_per_step
    envs = [state.make_env("train", problem_seed(cfg.seed, step, i, P)) for i in range(P)]
    run = tree_rollout if cfg.rollout.mode == "tree" else trajectory_rollout
    return run(envs, state.backend.rollout_policies(state), state.agent_map, cfg.rollout.K, cfg.rollout.temperature,
               cfg.rollout.max_new_tokens, cfg.algo.alpha, state.generator, step_envs=state.backend.step_envs,
               per_agent=cfg.rollout.per_agent)


def assign_advantages(cfg: Config, samples: list[Sample]) -> dict[str, float]:
    """Group the samples, fill ``advantage`` and ``group``; return group statistics. Tree mode scores each
    sample by its immediate reward; trajectory mode by its trajectory's return (classic GRPO)."""
    keys = [group_key_fn(cfg.algo.group_key)(s) for s in samples]
    if cfg.rollout.mode == "tree" and cfg.algo.group_key == "problem_turn_agent":
        check_group_sizes(keys, cfg.rollout.K)
    ids, uniq = group_index(keys)
    rewards = torch.tensor([s.reward if cfg.rollout.mode == "tree" else s.episode_return for s in samples])
    adv, zero_var = grouped_advantages(rewards, torch.tensor(ids), cfg.algo.std_normalize)
    for s, a, k, z in zip(samples, adv.tolist(), keys, zero_var.tolist()):
        s.advantage, s.group = a, key_str(k)
        s.info["zero_variance"] = z
    zv_groups = len({i for i, z in zip(ids, zero_var.tolist()) if z})
    return {"group/count": float(len(uniq)), "group/mean_size": len(samples) / max(1, len(uniq)),
            "group/zero_variance_frac": zv_groups / max(1, len(uniq)),
            "adv/mean": float(adv.mean()), "adv/std": float(adv.std()) if len(adv) > 1 else 0.0,
            "adv/abs_mean": float(adv.abs().mean())}


def train_step(state: TrainState, step: int) -> tuple[dict[str, Any], list[Sample]]:
    cfg, timings = state.cfg, {}
    t0 = time.perf_counter()

    samples, episodes = rollout(state, step)
    timings["time/rollout"] = time.perf_counter() - t0

    t = time.perf_counter()
    metrics = assign_advantages(cfg, samples)
    timings["time/advantages"] = time.perf_counter() - t

    t = time.perf_counter()
    tokens = 0
    batches = {pid: [s for s in samples if s.policy == pid
                     and not (cfg.algo.filter_zero_variance and s.info["zero_variance"])] for pid in state.policies}
    for pid, upd in state.backend.update(state, batches).items():
        tokens += upd.tokens
        for k in ("loss", "clipfrac", "approx_kl", "grad_norm", "samples", "optimizer_steps", "skipped_nonfinite"):
            metrics[f"update/{pid}/{k}"] = float(getattr(upd, k))
    timings["time/update"] = time.perf_counter() - t

    metrics.update(rollout_metrics(samples, episodes))
    metrics.update(state.backend.step_metrics())
    pids = list(state.policies)
    for k in ("loss", "clipfrac", "approx_kl"):  # sample-weighted over policies
        w = [metrics[f"update/{p}/samples"] for p in pids]
        metrics[f"loss/{'pg' if k == 'loss' else k}"] = (
            sum(metrics[f"update/{p}/{k}"] * wi for p, wi in zip(pids, w)) / max(1.0, sum(w)))
    timings["time/step"] = time.perf_counter() - t0
    gen_tokens = sum(len(s.response_ids) for s in samples)
    metrics["perf/rollout_tokens_per_s"] = gen_tokens / max(1e-9, timings["time/rollout"])
    metrics["perf/update_tokens_per_s"] = tokens / max(1e-9, timings["time/update"])
    metrics["perf/tokens_per_s"] = (gen_tokens + tokens) / max(1e-9, timings["time/step"])
    metrics.update(timings)
    return metrics, samples


def rollout_metrics(samples: list[Sample], episodes: list[EpisodeResult]) -> dict[str, float]:
    """Per-agent reward terms of all candidates, and the outcome of the kept trajectories."""
    by_agent: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_agent[s.agent].append(s)
    out: dict[str, float] = {}
    for agent, ss in by_agent.items():
        n = len(ss)
        out[f"rollout/reward/{agent}"] = sum(s.reward for s in ss) / n
        out[f"rollout/reward_team/{agent}"] = sum(s.reward_team for s in ss) / n
        out[f"rollout/reward_local/{agent}"] = sum(s.reward_local for s in ss) / n
        out[f"rollout/parse_error_rate/{agent}"] = sum(bool(s.info.get("parse_error")) for s in ss) / n
        ran = [s.info for s in ss if "program_crashed" in s.info]
        if ran:  # the agent's answers are run as programs (math's tool, the games' tool in code mode)
            for flag in ("crashed", "timed_out", "unparsable"):
                out[f"rollout/program_{flag}_rate/{agent}"] = sum(bool(i[f"program_{flag}"]) for i in ran) / len(ran)
    n_ep = max(1, len(episodes))
    out["rollout/success_rate"] = sum(e.success for e in episodes) / n_ep
    out["rollout/turns"] = sum(e.turns for e in episodes) / n_ep
    out["rollout/samples"] = float(len(samples))
    out["rollout/response_tokens"] = sum(len(s.response_ids) for s in samples) / max(1, len(samples))
    out["rollout/unfinished_frac"] = sum(not s.finished for s in samples) / max(1, len(samples))
    return out
