"""``atgrpo bench learning``: the paper's results table in miniature, on tiny policies and CPU.

Rows are the methods of REFERENCE section 6 plus the grouping ablation; columns are Plan-Path, Sokoban and
Sudoku; each cell is the held-out greedy success rate, mean and std over seeds. Every RL method gets the same
budget: the same problems per step, K, steps and warm start. The no-RL rows are the *before-RL* evaluation of
the matching RL runs (same warm-started weights, same held-out problems), so they cost nothing extra:
"single agent" is the starting point of "single agent + GRPO", and "MAS (no RL)" that of the L1 runs.

Writes ``results.json``, ``results.md`` and ``learning_curves.png`` into the output directory, plus one run
directory per (task, method, seed) under ``runs/``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

# method -> overrides; "before_of" rows reuse another method's before-RL evaluation
RL_METHODS: dict[str, list[str]] = {
    "single agent + GRPO": ["policy.sharing=L0", "rollout.mode=trajectory", "algo.group_key=problem"],
    "MAS + AT-GRPO shared (L1)": ["policy.sharing=L1", "rollout.mode=tree", "algo.group_key=problem_turn_agent"],
    "MAS + AT-GRPO per-role (L3)": ["policy.sharing=L3", "rollout.mode=tree", "algo.group_key=problem_turn_agent"],
    "MAS + trajectory GRPO (ablation)": ["policy.sharing=L1", "rollout.mode=trajectory", "algo.group_key=problem"],
}
BEFORE_ROWS = {"single agent": "single agent + GRPO", "MAS (no RL)": "MAS + AT-GRPO shared (L1)"}
ROW_ORDER = ["single agent", "single agent + GRPO", "MAS (no RL)", "MAS + AT-GRPO shared (L1)",
             "MAS + AT-GRPO per-role (L3)", "MAS + trajectory GRPO (ablation)"]

TASKS: dict[str, list[str]] = {
    "plan_path": ["env.name=plan_path", "env.kwargs.size=5", "env.kwargs.wall_prob=0.2", "env.kwargs.max_turns=3"],
    "sokoban": ["env.name=sokoban", "env.kwargs.size=5", "env.kwargs.max_turns=3"],
    "sudoku": ["env.name=sudoku", "env.kwargs.size=4", "env.kwargs.max_turns=3", "rollout.max_new_tokens=20"],
}
SIZES: dict[str, dict[str, Any]] = {
    "default": {"seeds": 3, "overrides": ["train.steps=20", "rollout.problems_per_step=8", "eval.problems=100",
                                          "eval.every=10"]},
    "quick": {"seeds": 1, "overrides": ["train.steps=2", "rollout.problems_per_step=4", "rollout.K=4",
                                        "eval.problems=10", "eval.every=0", "warmstart.episodes=20",
                                        "warmstart.epochs=1"]},
}
COMMON = ["train.tensorboard=false", "train.plot=false", "train.checkpoint_every=0"]


def run_learning_bench(out: str, size: str = "default", tasks: list[str] | None = None,
                       seeds: int | None = None, progress: bool = True) -> dict[str, Any]:
    from ..config import load_config
    from ..trainer.run import train

    spec = SIZES[size]
    tasks = tasks or list(TASKS)
    n_seeds = seeds or spec["seeds"]
    os.makedirs(out, exist_ok=True)
    runs: list[dict[str, Any]] = []
    start = time.time()
    total = len(tasks) * len(RL_METHODS) * n_seeds
    for task in tasks:
        for method, overrides in RL_METHODS.items():
            for seed in range(n_seeds):
                items = TASKS[task] + overrides + spec["overrides"] + COMMON + [f"seed={seed}"]
                cfg = load_config(None, items)
                run_dir = os.path.join(out, "runs", f"{task}-{_slug(method)}-seed{seed}")
                t = time.time()
                summary = train(cfg, run_dir, progress=False)
                curve = _eval_curve(run_dir, summary)
                runs.append({"task": task, "method": method, "seed": seed, "overrides": items,
                             "before": summary["eval_before"]["success_rate"],
                             "after": summary["eval_after"]["success_rate"], "curve": curve,
                             "samples": _samples(run_dir), "seconds": time.time() - t})
                if progress:
                    print(f"[{len(runs)}/{total}] {task:<9} {method:<34} seed {seed}: "
                          f"{runs[-1]['before']:.2f} -> {runs[-1]['after']:.2f} ({runs[-1]['seconds']:.0f}s)",
                          flush=True)
    table = _table(runs, tasks)
    result = {"size": size, "seeds": n_seeds, "tasks": tasks, "table": table, "runs": runs,
              "wall_seconds": time.time() - start,
              "command": (f"atgrpo bench learning{' --quick' if size == 'quick' else ''}"
                          f"{f' --seeds {seeds}' if seeds else ''}"
                          f"{f' --tasks {chr(44).join(tasks)}' if tasks != list(TASKS) else ''} --out {out}")}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(result))
    _plot(runs, tasks, os.path.join(out, "learning_curves.png"))
    return result


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method.lower()).strip("_")


def _eval_curve(run_dir: str, summary: dict[str, Any]) -> list[tuple[int, float]]:
    curve = [(0, summary["eval_before"]["success_rate"])]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "eval/success_rate" in row:
                curve.append((row["step"], row["eval/success_rate"]))
    return curve


def _samples(run_dir: str) -> int:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return int(sum(json.loads(line).get("rollout/samples", 0) for line in f))


def _table(runs: list[dict[str, Any]], tasks: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for row in ROW_ORDER:
        method, key = (BEFORE_ROWS[row], "before") if row in BEFORE_ROWS else (row, "after")
        table[row] = {}
        for task in tasks:
            vals = [r[key] for r in runs if r["task"] == task and r["method"] == method]
            if vals:
                table[row][task] = {"mean": statistics.fmean(vals),
                                    "std": statistics.pstdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}
    return table


def markdown(result: dict[str, Any]) -> str:
    tasks = result["tasks"]
    lines = [f"Held-out greedy success (%), mean ± std over {result['seeds']} seed(s); "
             f"command: `{result['command']}`; {result['wall_seconds'] / 60:.1f} min.", "",
             "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for row, cells in result["table"].items():
        vals = [f"{100 * cells[t]['mean']:.1f} ± {100 * cells[t]['std']:.1f}" if t in cells else "-" for t in tasks]
        lines.append(f"| {row} | " + " | ".join(vals) + " |")
    budget = {}
    for r in result["runs"]:
        budget.setdefault((r["task"], r["method"]), []).append(r["samples"])
    lines += ["", "Sampled responses per run (the sample budget), mean over seeds:", "",
              "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for method in RL_METHODS:
        vals = [f"{statistics.fmean(budget[(t, method)]):.0f}" if (t, method) in budget else "-" for t in tasks]
        lines.append(f"| {method} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def _plot(runs: list[dict[str, Any]], tasks: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method in RL_METHODS:
            curves = [r["curve"] for r in runs if r["task"] == task and r["method"] == method]
            if not curves:
                continue
            steps = [s for s, _ in curves[0]]
            mean = [statistics.fmean(c[i][1] for c in curves if i < len(c)) for i in range(len(steps))]
            ax.plot(steps, mean, "o-", label=method)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out success")
        ax.set_ylim(0, 1)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
