"""The AT-GRPO train step, read top to bottom: rollout -> advantages -> update per policy -> metrics.

Strictly on-policy and synchronous (docs/method.md): every policy is updated on the samples it generated
in this step's rollout, and the next rollout uses the new weights (same objects: no sync needed locally).
Where the work runs is the backend's business (``state.backend``, a ``backend.Backend``): ``LocalBackend``
in this process; ``vllm_backend.VLLMBackend`` with rollouts on vLLM; ``ray.driver.RayBackend`` on Ray actors
(docs/ray.md). The step is the same code for all.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..algorithms.advantages import grouped_advantages
from ..algorithms.grouping import check_group_sizes, group_index, group_key_fn, key_str
from ..config import AlgoConfig
from ..rollout.records import EpisodeResult, Sample
from ..rollout.tree import trajectory_rollout, tree_rollout
from .memory import phase
from .setup import problem_seed, train_sampling
from .state import TrainState
from .update import UpdateStats


@dataclass
class StepResult:
    """What one train step produced: the samples (advantages filled) and kept episodes, each policy's update
    statistics, the group statistics, the backend's own metrics and the timings (seconds). ``metrics()`` turns
    it into the flat metric names of metrics.jsonl, in this one place."""

    samples: list[Sample]
    episodes: list[EpisodeResult]
    groups: dict[str, float]  # group/* and adv/* (``assign_advantages``)
    updates: dict[str, UpdateStats]  # policy id -> its update
    backend: dict[str, float]  # the backend's metrics (Ray: ray/*)
    timings: dict[str, float]  # rollout, advantages, update, step
    peaks: dict[str, float]  # rollout, update: this process's peak resident memory in the phase (MiB)

    @property
    def skipped_nonfinite(self) -> int:
        """Optimizer steps skipped in this step for a non-finite loss or gradient, over all policies."""
        return sum(u.skipped_nonfinite for u in self.updates.values())

    def metrics(self) -> dict[str, float]:
        m = dict(self.groups)
        for pid, u in self.updates.items():
            for k in ("loss", "clipfrac", "approx_kl", "grad_norm", "samples", "optimizer_steps", "skipped_nonfinite"):
                m[f"update/{pid}/{k}"] = float(getattr(u, k))
            if u.ref_kl is not None:
                m[f"update/{pid}/ref_kl"] = u.ref_kl
        m.update(rollout_metrics(self.samples, self.episodes))
        for u in self.updates.values():
            m.update(u.logprob_gap)  # rollouts from another sampler: how far its log-probs were from the trainer's
        if any(u.logprob_gap for u in self.updates.values()):
            m["time/logprob_recompute"] = sum(u.rescore_s for u in self.updates.values())
        m.update(self.backend)
        weight = sum(float(u.samples) for u in self.updates.values())
        for k in ("loss", "clipfrac", "approx_kl"):  # sample-weighted over policies
            m[f"loss/{'pg' if k == 'loss' else k}"] = (
                sum(float(getattr(u, k)) * u.samples for u in self.updates.values()) / max(1.0, weight))
        penalised = [u for u in self.updates.values() if u.ref_kl is not None]
        if penalised:  # algo.kl_coef > 0: how far the policies have moved from the reference
            m["loss/ref_kl"] = sum(u.ref_kl * u.samples for u in penalised) / max(1.0, sum(u.samples for u in penalised))
        gen_tokens = sum(len(s.response_ids) for s in self.samples)
        upd_tokens = sum(u.tokens for u in self.updates.values())
        t = self.timings
        m["perf/rollout_tokens_per_s"] = gen_tokens / max(1e-9, t["rollout"])
        m["perf/update_tokens_per_s"] = upd_tokens / max(1e-9, t["update"])
        m["perf/tokens_per_s"] = (gen_tokens + upd_tokens) / max(1e-9, t["step"])
        m.update({f"time/{k}": v for k, v in t.items()})
        m.update({f"perf/peak_rss_mb/{k}": v for k, v in self.peaks.items()})
        return m


def rollout(state: TrainState, step: int) -> tuple[list[Sample], list[EpisodeResult]]:
    """This step's training problems, sampled by the configured rollout (tree: AT-GRPO; trajectory: GRPO)."""
    cfg = state.cfg
    P = cfg.rollout.problems_per_step
    envs = [state.make_env("train", problem_seed(cfg.seed, step, i, P)) for i in range(P)]
    run = tree_rollout if cfg.rollout.mode == "tree" else trajectory_rollout
    return run(envs, state.backend.rollout_policies(state), state.agent_to_policy, train_sampling(cfg), state.generator,
               step_envs=state.backend.step_envs)


def assign_advantages(samples: list[Sample], algo: AlgoConfig, group_size: int | None = None) -> dict[str, float]:
    """Group the samples by ``algo.group_key``, fill ``advantage`` (from each sample's ``score``, which the
    rollout set) and ``group``; return group statistics. ``group_size``: every group must have exactly this
    many members (the tree's K per node: a smaller group means the grouping is wrong)."""
    keys = [group_key_fn(algo.group_key)(s) for s in samples]
    if group_size is not None:
        check_group_sizes(keys, group_size)
    ids, uniq = group_index(keys)
    adv, zero_var = grouped_advantages(torch.tensor([s.score for s in samples]), torch.tensor(ids),
                                       algo.std_normalize)
    for s, a, k, z in zip(samples, adv.tolist(), keys, zero_var.tolist()):
        s.advantage, s.group = a, key_str(k)
        s.info["zero_variance"] = z
    zv_groups = len({i for i, z in zip(ids, zero_var.tolist()) if z})
    return {"group/count": float(len(uniq)), "group/mean_size": len(samples) / max(1, len(uniq)),
            "group/zero_variance_frac": zv_groups / max(1, len(uniq)),
            "adv/mean": float(adv.mean()), "adv/std": float(adv.std()) if len(adv) > 1 else 0.0,
            "adv/abs_mean": float(adv.abs().mean())}


def train_step(state: TrainState, step: int) -> StepResult:
    """Rollout -> advantages -> each policy's update on its own samples."""
    cfg, timings, peaks = state.cfg, {}, {}
    t0 = time.perf_counter()
    with phase("rollout", peaks):
        samples, episodes = rollout(state, step)
    timings["rollout"] = time.perf_counter() - t0

    t = time.perf_counter()
    exact_groups = cfg.rollout.mode == "tree" and cfg.algo.group_key == "problem_turn_agent"
    groups = assign_advantages(samples, cfg.algo, cfg.rollout.K if exact_groups else None)
    timings["advantages"] = time.perf_counter() - t

    t = time.perf_counter()
    batches = {pid: [s for s in samples if s.policy == pid
                     and not (cfg.algo.filter_zero_variance and s.info["zero_variance"])] for pid in state.policies}
    with phase("update", peaks):
        updates = state.backend.update(state, batches)
    timings["update"] = time.perf_counter() - t
    backend = state.backend.step_metrics()
    timings["step"] = time.perf_counter() - t0
    return StepResult(samples, episodes, groups, updates, backend, timings, peaks)


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
