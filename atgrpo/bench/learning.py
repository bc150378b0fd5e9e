"""``atgrpo bench learning``: the paper's results table in miniature, on tiny policies and CPU.

Rows are the methods of the paper's results table plus the grouping ablation; columns are Plan-Path, Sokoban,
Sudoku and math; each cell is the held-out greedy success rate, mean and std over seeds. Every RL method gets the same
budget: the same K, steps and warm start, and about the same number of sampled responses (the single agent gets
twice the problems per step, since the team acts twice per turn). The no-RL rows are the *before-RL* evaluation of
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

from ..config import overrides_tree

# method -> overrides. The single agent acts once per turn where the two-agent team acts twice, so it gets twice
# the problems per step: every RL method then samples about the same number of responses (reported per run).
RL_METHODS: dict[str, list[str]] = {
    "single agent + GRPO": ["policy.sharing=L0", "rollout.mode=trajectory", "algo.group_key=problem"],
    "MAS + AT-GRPO shared (L1)": ["policy.sharing=L1", "rollout.mode=tree", "algo.group_key=problem_turn_agent"],
    "MAS + AT-GRPO per-role (L3)": ["policy.sharing=L3", "rollout.mode=tree", "algo.group_key=problem_turn_agent"],
    "MAS + trajectory GRPO (ablation)": ["policy.sharing=L1", "rollout.mode=trajectory", "algo.group_key=problem"],
}
PROBLEMS_FACTOR = {"single agent + GRPO": 2}
BEFORE_ROWS = {"single agent": "single agent + GRPO", "MAS (no RL)": "MAS + AT-GRPO shared (L1)"}
ROW_ORDER = ["single agent", "single agent + GRPO", "MAS (no RL)", "MAS + AT-GRPO shared (L1)",
             "MAS + AT-GRPO per-role (L3)", "MAS + trajectory GRPO (ablation)"]

# Each task's warm start is sized so the starting policy is weak but not useless (held-out success ~0.05-0.3, as
# the paper's single agents): a stronger one leaves RL nothing to do (Plan-Path starts at 0.79 after 6 epochs).
TASKS: dict[str, list[str]] = {
    "plan_path": ["env.name=plan_path", "env.kwargs.size=5", "env.kwargs.wall_prob=0.2", "env.kwargs.max_turns=3"],
    # Sokoban 5x5 (3x3 interior): one fixed 12-move answer solves ~40% of the held-out rooms and RL finds such
    # answers, so this column cannot separate the methods; at 6x6 (fixed answers 0.05-0.23) the tiny policies do
    # not learn (benchmarks/constant_answer.py; docs/results.md)
    "sokoban": ["env.name=sokoban", "env.kwargs.size=5", "env.kwargs.max_turns=3", "warmstart.batch_size=16",
                "warmstart.epochs=6"],
    "sudoku": ["env.name=sudoku", "env.kwargs.size=4", "env.kwargs.holes=4", "env.kwargs.max_turns=3",
               "rollout.max_new_tokens=20", "warmstart.batch_size=16", "warmstart.epochs=3"],
    # arithmetic, 2-3 terms of 1-2 digits: the tool agent prints the expression, the reasoner boxes an answer; the
    # single agent is the reasoner alone, which must compute in its head
    "math": ["env.name=math", "env.style=compact", "env.kwargs.dataset=arithmetic", "env.kwargs.max_turns=3",
             "env.kwargs.timeout=2.0", "env.kwargs.dataset_kwargs={min_terms: 2, max_terms: 3, min_digits: 1, "
             "max_digits: 2}", "model.max_prompt_tokens=256", "rollout.max_new_tokens=32", "warmstart.noise=0.1",
             # the team's greedy held-out success after 1000 episodes x 3 / 4 / 5 / 6 epochs: 0.03 / 0.03 / 0.40 /
             # 0.65 (60 problems, L1); at 400 x 4 (0.05) sampled answers were unreadable and RL made it worse
             "warmstart.episodes=1000", "warmstart.epochs=5"],
}
# Each task's RL recipe and budget, over the common ones below: the same for every row of the task. Kept apart
# from TASKS because `atgrpo bench teams` reuses TASKS['math'] with its own recipe.
# small updates and cooler samples, for the tasks whose tiny policies must copy from the prompt (digits, givens)
GENTLE = ["algo.lr=5e-5", "rollout.temperature=0.7"]
TASK_RECIPE: dict[str, list[str]] = {
    # the tiny math team's digit copying breaks under larger updates or hotter samples: held-out success 0.40 ->
    # 0.23 in 10 steps at lr 2e-4 (T 0.7), 0.37 at 1e-4, 0.43 at 5e-5; at T 1.0 (lr 5e-5) the rollouts' success
    # fell 0.31 -> 0.19 in 8 steps (seed 0, 60 held-out problems; docs/results.md)
    "math": GENTLE,
    # Sudoku's teams lost the copying of the givens at lr 2e-4 and T 1.0 (L1 17.3 -> 11.3 %, one seed to 0: grids of
    # 3s, rejected whole); at math's lr and temperature L1 seeds 0-2 ended at 0.27 / 0.24 / 0.10 (docs/results.md)
    "sudoku": GENTLE,
}
# default size, over its 30 steps: Plan-Path's L1 run rises until step 40 and then stays (held-out 0.09, 0.10, 0.38,
# 0.46, 0.56, 0.56, 0.58 every 10 steps to 60, seed 0); Sokoban's stops by step 30. A math run's warm start alone
# takes ~4 minutes, so its column gets a third of the steps to keep the whole table within two hours.
TASK_BUDGET: dict[str, list[str]] = {"plan_path": ["train.steps=40"], "math": ["train.steps=10", "eval.every=5"]}
# Advantages without the per-group std division (as Dr. GRPO), for every method alike: with it, Sokoban's
# -0.01-per-move cost, blown up to unit scale in groups where nobody solves, drove both the single agent and the
# team to one-move answers (held-out success 0.28 -> 0.08 in 20 steps; docs/results.md).
RECIPE = ["algo.std_normalize=false"]
SIZES: dict[str, dict[str, Any]] = {
    "default": {"seeds": 3, "problems": 16, "overrides": ["train.steps=30", "eval.problems=100", "eval.every=10"]},
    "quick": {"seeds": 1, "problems": 4, "overrides": ["train.steps=2", "rollout.K=4", "eval.problems=10",
                                                       "eval.every=0", "warmstart.episodes=20",
                                                       "warmstart.epochs=1"]},
}
# one torch thread per run: results do not depend on --jobs, and small runs side by side use the cores better
COMMON = ["train.tensorboard=false", "train.plot=false", "train.checkpoint_every=0", "train.threads=1"]


def cell_overrides(task: str, method: str, size: str, seed: int) -> list[str]:
    """Every override of one (task, method, seed) run, in the order they apply."""
    spec = SIZES[size]
    problems = spec["problems"] * PROBLEMS_FACTOR.get(method, 1)
    budget = TASK_BUDGET.get(task, []) if size == "default" else []
    return (TASKS[task] + RL_METHODS[method] + RECIPE + TASK_RECIPE.get(task, [])
            + [f"rollout.problems_per_step={problems}"] + spec["overrides"] + budget + COMMON + [f"seed={seed}"])


def run_cell(items: list[str], run_dir: str) -> dict[str, Any]:
    """Train one cell of the table (in a worker process); its before/after evaluation, curve and budget."""
    from ..config import load_config
    from ..trainer.run import train

    t = time.time()
    summary = train(load_config(None, items), run_dir, progress=False)
    curve, samples = _curve_and_samples(run_dir, summary)
    return {"overrides": items, "before": summary["eval_before"]["success_rate"],
            "after": summary["eval_after"]["success_rate"], "curve": curve, "samples": samples,
            "seconds": time.time() - t}


def run_learning_bench(out: str, size: str = "default", tasks: list[str] | None = None,
                       seeds: int | None = None, jobs: int | None = None, progress: bool = True,
                       methods: list[str] | None = None) -> dict[str, Any]:
    """Run the table: every (task, method, seed) cell as its own training, ``jobs`` at a time (default: one per
    core), each in a fresh process with one torch thread. A cell that raises is reported (``result["failed"]``)
    and left out of the table; the others go on. ``runs.jsonl`` gets each cell as it finishes. ``methods``: a
    subset of the RL rows by their config names (``mas_atgrpo_L3``, ...; default all)."""
    from ..config import ConfigError

    tasks = tasks or list(TASKS)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ConfigError(f"unknown learning-bench task(s) {', '.join(unknown)}; choose from: {', '.join(TASKS)}")
    by_name = {CONFIG_NAMES[m]: m for m in RL_METHODS}
    wrong = [m for m in methods or [] if m not in by_name]
    if wrong:
        raise ConfigError(f"unknown learning-bench method(s) {', '.join(wrong)}; choose from: {', '.join(by_name)}")
    chosen = [by_name[m] for m in methods] if methods else list(RL_METHODS)
    n_seeds = seeds or SIZES[size]["seeds"]
    jobs = jobs or os.cpu_count() or 1
    os.makedirs(out, exist_ok=True)
    cells = [({"task": task, "method": method, "seed": seed}, cell_overrides(task, method, size, seed))
             for task in tasks for method in chosen for seed in range(n_seeds)]
    start = time.time()
    runs, failed = run_cells(cells, out, jobs, progress)
    table = _table(runs, tasks)
    result = {"size": size, "seeds": n_seeds, "tasks": tasks, "jobs": jobs, "table": table, "runs": runs,
              "failed": failed,
              "wall_seconds": time.time() - start,
              "command": (f"atgrpo bench learning{' --quick' if size == 'quick' else ''}"
                          f"{f' --seeds {seeds}' if seeds else ''}"
                          f"{f' --tasks {chr(44).join(tasks)}' if tasks != list(TASKS) else ''}"
                          f"{f' --methods {chr(44).join(methods)}' if methods else ''} --out {out}")}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(result))
    _plot(runs, tasks, os.path.join(out, "learning_curves.png"))
    return result


def run_cells(cells: list[tuple[dict[str, Any], list[str]]], out: str, jobs: int, progress: bool = True
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train each cell ``(its labels, its overrides)`` in a fresh process, ``jobs`` at a time, into
    ``out/runs/<labels>``; ``out/runs.jsonl`` gets each as it finishes. Returns (runs in the cells' order, each
    the labels plus ``run_cell``'s result; failed cells, each the labels plus the error). A cell that raises is
    reported and the others go on."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    done: dict[int, dict[str, Any]] = {}  # cell index -> its run, as they finish
    failed: list[dict[str, Any]] = []
    start = time.time()

    def name(labels: dict[str, Any]) -> str:
        return "-".join(_slug(str(v)) if k != "seed" else f"seed{v}" for k, v in labels.items())

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool, \
            open(os.path.join(out, "runs.jsonl"), "w") as log:  # one line per finished cell, as they finish
        futures = {pool.submit(run_cell, items, os.path.join(out, "runs", name(labels))): i
                   for i, (labels, items) in enumerate(cells)}
        for fut in as_completed(futures):
            i = futures[fut]
            labels = cells[i][0]
            head = f"[{len(done) + len(failed) + 1}/{len(cells)}] " + " / ".join(str(v) for v in labels.values())
            try:
                r = done[i] = {**labels, **fut.result()}
            except Exception as e:  # one failed cell must not lose the others: report it, go on
                failed.append({**labels, "error": f"{type(e).__name__}: {e}"})
                print(f"{head}: FAILED: {failed[-1]['error']}", flush=True)
                continue
            log.write(json.dumps(r) + "\n")
            log.flush()
            if progress:
                print(f"{head}: {r['before']:.2f} -> {r['after']:.2f} ({r['seconds']:.0f}s; "
                      f"{(time.time() - start) / 60:.1f} min so far)", flush=True)
    return [done[i] for i in sorted(done)], failed


# ---- the table's runs as config files ---------------------------------------------------------------------
CONFIG_NAMES = {"single agent": "single", "single agent + GRPO": "single_grpo", "MAS (no RL)": "mas",
                "MAS + AT-GRPO shared (L1)": "mas_atgrpo_L1", "MAS + AT-GRPO per-role (L3)": "mas_atgrpo_L3",
                "MAS + trajectory GRPO (ablation)": "mas_trajectory_grpo"}
BOOKKEEPING = {"train.tensorboard", "train.plot", "train.checkpoint_every"}  # bench-only: not written to files


def row_overrides(task: str, row: str, seed: int = 0) -> list[str]:
    """The overrides of one table row at the default size; the no-RL rows are their RL run with 0 steps."""
    method = BEFORE_ROWS.get(row, row)
    items = [i for i in cell_overrides(task, method, "default", seed) if i.split("=")[0] not in BOOKKEEPING]
    return items + (["train.steps=0"] if row in BEFORE_ROWS else [])


def write_configs(directory: str) -> list[str]:
    """Write ``<task>_<row>.yaml`` for every task and row of the table (``configs/games/``), so each cell can be
    rerun alone with ``atgrpo train FILE``. Returns the paths."""
    import yaml

    os.makedirs(directory, exist_ok=True)
    paths = []
    for task in TASKS:
        for row in ROW_ORDER:
            data = overrides_tree(row_overrides(task, row))
            note = (f"# {task}, '{row}': one cell of `atgrpo bench learning` (seed 0; the bench runs seeds 0-2).\n"
                    f"# Written by `python -m atgrpo.bench.learning --write-configs {directory}`; do not edit by "
                    f"hand\n# (tests/test_bench.py checks these files against the bench's definitions).\n")
            if row in BEFORE_ROWS:
                note += "# No RL: warm start, then the held-out evaluation (train.steps: 0).\n"
            path = os.path.join(directory, f"{task}_{CONFIG_NAMES[row]}.yaml")
            with open(path, "w") as f:
                f.write(note + yaml.safe_dump(data, sort_keys=False))
            paths.append(path)
    return paths


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method.lower()).strip("_")


def _curve_and_samples(run_dir: str, summary: dict[str, Any]) -> tuple[list[tuple[int, float]], int]:
    """From one read of metrics.jsonl: the held-out success curve (step 0 = before RL) and the responses
    sampled over the run (its sample budget)."""
    curve, samples = [(0, summary["eval_before"]["success_rate"])], 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            samples += row.get("rollout/samples", 0)
            if "eval/success_rate" in row:
                curve.append((row["step"], row["eval/success_rate"]))
    return curve, int(samples)


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
             f"command: `{result['command']}`; {result['wall_seconds'] / 60:.1f} min "
             f"({result.get('jobs', 1)} runs at a time).", ""]
    for f in result.get("failed", []):
        lines.append(f"**FAILED, left out of the table**: {f['task']} / {f['method']} / seed {f['seed']}: {f['error']}")
    lines += ["| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
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


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-configs", metavar="DIR", required=True, help="write one config file per table cell")
    print("\n".join(write_configs(ap.parse_args().write_configs)))
