"""The paper's training settings as configs (``configs/paper/``), one per task family and sharing level.

    python -m atgrpo.bench.paper_recipes --write configs/paper     # (re)write them; tests/test_paper_recipes.py
                                                                  # checks the files against this module

Every number comes from the paper's setting (docs/method.md, "The paper's settings"): Qwen3-1.7B without thinking,
32 problems per step, K = 8, 200 steps, prompts of 4096 and responses of 2048 tokens, training temperature 1.0,
evaluation every 10 steps (greedy for the games, 0.6 for math and code), the PPO loss with clip 0.2 / 0.2,
lr 1e-6 constant, grad clip 1.0, no KL, float32 master weights under bfloat16 autocast (an lr of 1e-6 rounds away
in bfloat16 weights). Shared (L1) and per-role (L3) policies. Settings the paper does not give are marked
``# not in the paper`` in the files. The GPU layout of each (Ray, one GPU per worker, 80 GiB GPUs) is the memory
planner's (``atgrpo plan-memory``), written at the top of each file; the test checks that the plan still fits it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import yaml

MODEL = "Qwen/Qwen3-1.7B"
GPU_GB = 80
TASKS = {  # env name, style, kwargs, evaluation temperature, what the paper trains on when our data differs
    "plan_path": ("plan_path", {"size": 10, "wall_prob": 0.22, "max_turns": 4}, 0.0, None),
    "sokoban": ("sokoban", {"size": 6, "num_boxes": 1, "max_turns": 4}, 0.0, None),
    "sudoku": ("sudoku", {"size": 4, "max_turns": 4}, 0.0, None),
    "code": ("code", {"dataset": "generated", "max_turns": 5}, 0.6,
             "the paper trains on CodeContests and APPS: env.kwargs.dataset=files env.kwargs.data_files=[...]"),
    "math": ("math", {"dataset": "gsm", "max_turns": 4}, 0.6,
             "the paper trains on competition math: env.kwargs.dataset=files env.kwargs.data_files=[...]"),
}
SHARING = ("L1", "L3")


def recipe(task: str, sharing: str, workers: tuple[int, int] = (2, 1)) -> dict:
    """The config of ``task`` at ``sharing`` with ``workers`` = (rollout, update) workers per policy."""
    env, kwargs, eval_temperature, _ = TASKS[task]
    rollout_workers, update_workers = workers
    ray = {"gpus_per_worker": 1, "num_rollout_workers": rollout_workers, "num_update_workers": update_workers}
    if update_workers > 1:
        ray["update_sharding"] = "fsdp"
    return {
        "seed": 0,
        "env": {"name": env, "style": "chat", "kwargs": dict(kwargs)},
        "model": {"kind": "hf", "path": MODEL, "enable_thinking": False, "dtype": "float32",
                  "precision": "bfloat16", "device": "cuda", "max_prompt_tokens": 4096,
                  "gradient_checkpointing": True},
        "policy": {"sharing": sharing},
        "rollout": {"mode": "tree", "K": 8, "problems_per_step": 32, "temperature": 1.0, "max_new_tokens": 2048},
        "algo": {"lr": 1.0e-6, "clip_low": 0.2, "clip_high": 0.2, "grad_clip": 1.0, "kl_coef": 0.0,
                 "alpha": 1.0, "warmup_steps": 0, "minibatches": 4, "update_token_budget": 8192},
        "warmstart": {"enabled": False},
        "eval": {"problems": 200, "temperature": eval_temperature, "every": 10},
        "train": {"steps": 200, "checkpoint_every": 10},
        "system": {"backend": "ray", "ray": ray},
    }


def layout(cfg_dict: dict) -> tuple[int, int, int]:
    """``(GPUs, rollout workers, update workers)`` per the memory planner for a recipe, on GPUs of ``GPU_GB``."""
    from .. import plan_memory as pm
    from ..config.checks import validate_env
    from ..config.loading import read_config

    cfg = _config(cfg_dict, read_config)
    s = pm.BUILTIN_SHAPES["qwen3-1.7b"]
    r = replace(pm.settings_from_config(cfg, validate_env(cfg)), device="cuda")
    fit = pm.fit_gpus(pm.plan(s, r), r, GPU_GB * pm.GIB)
    if fit.ray_gpus is None:
        raise ValueError(f"no layout on {GPU_GB} GiB GPUs")
    return fit.ray_gpus, fit.rollout_workers, fit.update_workers


def _config(cfg_dict: dict, read_config):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg_dict, f, sort_keys=False)
    try:
        return read_config(f.name, [])
    finally:
        os.unlink(f.name)


def text(task: str, sharing: str) -> str:
    """The file: a header (what it is, the plan's layout, the notes), then the config."""
    gpus, rw, uw = layout(recipe(task, sharing))
    cfg = recipe(task, sharing, (rw, uw))
    note = TASKS[task][3]
    who = "one shared policy for both roles (L1)" if sharing == "L1" else "one full model per role (L3)"
    lines = [f"# The paper's setting: {task}, Qwen3-1.7B, {who}.",
             "# Written by `python -m atgrpo.bench.paper_recipes --write configs/paper`; do not edit by hand",
             "# (tests/test_paper_recipes.py checks the files).",
             f"# GPU layout (atgrpo plan-memory, {GPU_GB} GiB GPUs): {gpus} GPUs, per policy {rw} rollout worker(s) "
             f"+ {uw} update worker(s).",
             "# Qwen3-8B: model.path=Qwen/Qwen3-8B, then `atgrpo plan-memory THIS --model qwen3-8b` for its layout.",
             "# Not in the paper: algo.minibatches (its PPO epoch's mini-batch count), algo.update_token_budget,",
             "# eval.problems, train.checkpoint_every, model.gradient_checkpointing (memory, not the method)."]
    if note:
        lines.append(f"# Data: {note}.")
    return "\n".join(lines) + "\n" + yaml.safe_dump(cfg, sort_keys=False)


def paths(root: str) -> dict[str, tuple[str, str]]:
    return {os.path.join(root, f"{task}_{sharing}.yaml"): (task, sharing) for task in TASKS for sharing in SHARING}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", metavar="DIR", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.write, exist_ok=True)
    for path, (task, sharing) in paths(args.write).items():
        with open(path, "w") as f:
            f.write(text(task, sharing))
        print(path)


if __name__ == "__main__":
    main()
