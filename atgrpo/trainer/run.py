"""The local runner: set up, warm start, evaluate, train for ``train.steps`` steps, evaluate, write outputs.

Run directory: config.yaml, metrics.jsonl, summary.json, rollouts/step_<N>.jsonl, eval_transcripts.jsonl,
tensorboard/, learning_curves.png, checkpoint/final/<policy>/ (transformers format).
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from typing import Any

import torch
import yaml

from ..config import Config
from .evaluate import evaluate
from .metrics import MetricsLogger, plot_curves, step_line
from .setup import agent_to_policy, build_policies, env_factory
from .step import TrainState, train_step
from .update import make_optimizer
from .warmstart import warm_start


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_state(cfg: Config) -> TrainState:
    seed_everything(cfg.seed)
    make_env = env_factory(cfg)
    agents = make_env("train", 0).agents
    amap = agent_to_policy(cfg, agents)
    policies = build_policies(cfg, sorted(set(amap.values())))
    optimizers = {pid: make_optimizer(p, cfg.algo) for pid, p in policies.items()}
    return TrainState(cfg, make_env, amap, policies, optimizers, torch.Generator().manual_seed(cfg.seed))


def run_eval(state: TrainState, seed: int) -> tuple[dict[str, float], list]:
    cfg = state.cfg
    return evaluate(state.make_env, state.policies, state.agent_map, cfg.eval.problems, cfg.eval.temperature,
                    cfg.rollout.max_new_tokens, cfg.algo.alpha, seed)


def save_policies(state: TrainState, path: str) -> None:
    for pid, policy in state.policies.items():
        d = os.path.join(path, pid)
        policy.model.save_pretrained(d)
        with open(os.path.join(d, "atgrpo_policy.json"), "w") as f:
            json.dump({"policy": pid, "tokenizer": type(policy.tokenizer).__name__,
                       "agents": [a for a, p in state.agent_map.items() if p == pid]}, f, indent=1)


def train(cfg: Config, run_dir: str, progress: bool = True) -> dict[str, Any]:
    """Run a whole training; returns the summary (also written to summary.json)."""
    start = time.time()
    os.makedirs(os.path.join(run_dir, "rollouts"), exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
    state = build_state(cfg)
    say = print if progress else (lambda *a, **k: None)
    n_params = {pid: p.num_parameters() for pid, p in state.policies.items()}
    say(f"atgrpo: env={cfg.env.name} sharing={cfg.policy.sharing} agents->policies={state.agent_map} "
        f"params={n_params} run_dir={run_dir}")
    logger = MetricsLogger(run_dir, cfg.train.tensorboard)
    summary: dict[str, Any] = {"run_dir": run_dir, "steps": cfg.train.steps, "agent_to_policy": state.agent_map}

    if cfg.warmstart.enabled and cfg.warmstart.episodes > 0:
        t = time.time()
        losses = warm_start(state.make_env, state.agent_map, state.policies, cfg.warmstart, cfg.seed, progress)
        summary["warmstart"] = {"loss": losses, "seconds": time.time() - t}
        say(f"warm start done in {time.time() - t:.0f}s; final loss " +
            ", ".join(f"{p}={v[-1]:.3f}" for p, v in losses.items() if v))
    if cfg.algo.kl_coef > 0:
        state.references = {pid: copy.deepcopy(p) for pid, p in state.policies.items()}

    before, _ = run_eval(state, cfg.seed)
    summary["eval_before"] = before
    say(f"eval before: success {before['success_rate']:.3f} on {int(before['problems'])} held-out problems")
    evals = [(0, before["success_rate"])]

    dump = set(cfg.train.dump_rollouts) or {1, cfg.train.steps}
    rows = []
    for step in range(1, cfg.train.steps + 1):
        metrics, samples = train_step(state, step)
        state.step = step
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.train.steps:
            ev, _ = run_eval(state, cfg.seed)
            metrics.update({f"eval/{k}": v for k, v in ev.items()})
            evals.append((step, ev["success_rate"]))
        logger.log(step, metrics)
        rows.append({"step": step, **metrics})
        say(step_line(rows[-1]))
        if step in dump:
            with open(os.path.join(run_dir, "rollouts", f"step_{step}.jsonl"), "w") as f:
                for s in samples:
                    f.write(json.dumps(s.dump()) + "\n")

    after, episodes = run_eval(state, cfg.seed)
    evals.append((cfg.train.steps, after["success_rate"]))
    logger.log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
    logger.close()
    with open(os.path.join(run_dir, "eval_transcripts.jsonl"), "w") as f:
        for e in episodes[:50]:
            f.write(json.dumps({"problem": e.problem, "success": e.success, "transcript": e.transcript}) + "\n")
    summary["eval_after"] = after
    summary["wall_seconds"] = time.time() - start
    save_policies(state, os.path.join(run_dir, "checkpoint", "final"))
    if cfg.train.plot and rows:
        summary["plot"] = plot_curves(run_dir, rows, evals)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    say(f"eval after: success {after['success_rate']:.3f} (before {before['success_rate']:.3f}); "
        f"{summary['wall_seconds']:.0f}s; outputs in {run_dir}")
    return summary


def load_policies(state: TrainState, path: str) -> None:
    """Load the weights saved by ``save_policies`` into the state's policies (same config)."""
    from transformers import AutoModelForCausalLM

    for pid, policy in state.policies.items():
        d = os.path.join(path, pid)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"no saved policy {pid!r} at {d}; policies of this config: {sorted(state.policies)}")
        loaded = AutoModelForCausalLM.from_pretrained(d)
        policy.model.load_state_dict(loaded.state_dict())


def evaluate_target(target: str, overrides: list[str], progress: bool = True) -> dict[str, Any]:
    """``atgrpo eval``: a run directory (its config and final checkpoint) or a config file (fresh policies,
    warm-started if the config says so: the no-RL baselines)."""
    from ..config import ConfigError, load_config

    if os.path.isdir(target):
        cfg_path = os.path.join(target, "config.yaml")
        if not os.path.exists(cfg_path):
            raise ConfigError(f"{target} is not a run directory (no config.yaml)")
        cfg = load_config(cfg_path, overrides)
        state = build_state(cfg)
        load_policies(state, os.path.join(target, "checkpoint", "final"))
    elif os.path.exists(target):
        cfg = load_config(target, overrides)
        state = build_state(cfg)
        if cfg.warmstart.enabled and cfg.warmstart.episodes > 0:
            warm_start(state.make_env, state.agent_map, state.policies, cfg.warmstart, cfg.seed, progress)
    else:
        raise ConfigError(f"{target!r} is neither a run directory nor a config file")
    metrics, _ = run_eval(state, cfg.seed)
    return {"target": target, "env": cfg.env.name, "sharing": cfg.policy.sharing, **metrics}
