"""The real-model table assembled from its cell files: ``table.json``, ``table.md`` and ``curves.png``
(nothing is run).

Per task and row: each seed's held-out success (an RL row: after RL; a no-RL row: its RL cell's evaluation
before RL), that cell's start value, precision, CPU, wall time, held-out problems and sampled responses; the
mean and std (population) over the seeds present. A cell not yet run is absent, and listed under ``missing``.
Per task, the table's three conditions (``conditions``), judged from those means and stds.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from .real_table import NO_RL_SOURCE, ROW_TITLES, ROWS, TASKS, select

COMMAND = "atgrpo bench real-table"
START_CAP = 0.6  # the team without RL must start at or below this
COLUMNS_NEEDED = 4  # columns whose RL row must be above both baselines
TEAM_RL_ROWS = ("mas_L1", "mas_L3")  # the rows a column is judged by (real_table.RL_ROWS adds the single agent)


def summarize(vals: list[float]) -> dict[str, Any]:
    """n, mean and population std of one row's per-seed successes (None for an empty row)."""
    return {"n": len(vals), "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.pstdev(vals) if vals else None}


def _above(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Row ``a`` above row ``b`` by more than one std of the seeds (the larger of the two rows' population
    stds, so neither row's spread is ignored); None while either row has fewer than two seeds."""
    if a["n"] < 2 or b["n"] < 2:
        return None
    gap, std = a["mean"] - b["mean"], max(a["std"], b["std"])
    return {"met": gap > std, "gap": round(gap, 4), "std": round(std, 4)}


def conditions(task_rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One task's column against the table's three conditions: the better RL row (shared or per role, by
    mean) above single agent + GRPO (``above_single_grpo``) and above the team without RL (``above_mas``) by
    more than one std of the seeds, and the team without RL at or below ``START_CAP`` (``mas_start``). Each
    is None while its rows lack two seeds."""
    runs = [r for r in TEAM_RL_ROWS if task_rows[r]["n"]]
    best = max(runs, key=lambda r: task_rows[r]["mean"]) if runs else None
    mas = task_rows["mas"]
    return {"best_rl_row": best,
            "above_single_grpo": _above(task_rows[best], task_rows["single_grpo"]) if best else None,
            "above_mas": _above(task_rows[best], mas) if best else None,
            "mas_start": ({"met": mas["mean"] <= START_CAP, "mean": round(mas["mean"], 4)}
                          if mas["n"] >= 2 else None)}


def assemble(cells: list[dict[str, Any]], seeds: list[int] | None = None, stale: list[str] = ()) -> dict[str, Any]:
    """table.json's content from the finished cells' results (``real_cells.current_cells``); ``missing``: the
    cells of the full table at ``seeds`` (default 0 and 1) without a result; ``stale``: cells whose result was
    run with an earlier config (left out of the table)."""
    by_key = {(c["task"], c["row"], c["seed"]): c for c in cells}
    table: dict[str, dict[str, Any]] = {}
    for task in TASKS:
        table[task] = {}
        for row in ROWS:
            source = NO_RL_SOURCE.get(row, row)
            per_seed = {}
            for (t, r, seed), c in sorted(by_key.items()):
                if t == task and r == source:
                    per_seed[str(seed)] = {
                        "success": c["start"] if row in NO_RL_SOURCE else c["end"], "start": c["start"],
                        "evals": c["evals"], "rollout_success": c.get("rollout_success"),
                        "eval_problems": c["eval_problems"], "samples": c["samples"],
                        "precision": c["precision"], "cpu": c["cpu"], "wall_seconds": c["wall_seconds"],
                        "extra_overrides": c.get("extra_overrides", [])}
            table[task][row] = {"title": ROW_TITLES[row], "from": f"{source} cell, "
                                + ("before RL" if row in NO_RL_SOURCE else "after RL"), "seeds": per_seed,
                                **summarize([s["success"] for s in per_seed.values()])}
    missing = [c.name for c in select(None, None, seeds) if (c.task, c.row, c.seed) not in by_key]
    return {"command": COMMAND, "model": "SmolLM2-135M-Instruct (model.preset=smollm2-135m)",
            "tasks": list(TASKS), "rows": list(ROWS), "table": table,
            "conditions": {t: conditions(table[t]) for t in TASKS}, "missing": missing, "stale": list(stale),
            "wall_seconds_total": sum(c["wall_seconds"] for c in cells)}


def markdown(data: dict[str, Any]) -> str:
    """The table as markdown: held-out success in %, mean ± std over the seeds present (n seeds)."""
    tasks = data["tasks"]
    lines = [f"Held-out greedy success (%), mean ± std over seeds (n); `{data['command']}`; SmolLM2-135M-Instruct. "
             f"Cells run so far: {data['wall_seconds_total'] / 60:.1f} min in all.", "",
             "| row | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for row in data["rows"]:
        vals = []
        for task in tasks:
            c = data["table"][task][row]
            vals.append(f"{100 * c['mean']:.1f} ± {100 * c['std']:.1f} ({c['n']})" if c["n"] else "-")
        lines.append(f"| {ROW_TITLES[row]} | " + " | ".join(vals) + " |")
    lines += ["", "The table's conditions per column (better RL row; a gap must exceed the larger std of the two rows; "
              f"the team without RL must start at or below {START_CAP}):", "",
              "| condition | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    conds = data["conditions"]
    lines.append("| better RL row | " + " | ".join(conds[t]["best_rl_row"] or "-" for t in tasks) + " |")
    for key, title in (("above_single_grpo", "above single agent + GRPO"), ("above_mas", "above MAS (no RL)")):
        lines.append(f"| {title} | " + " | ".join(_verdict(conds[t][key], "gap {gap:.2f} vs std {std:.2f}")
                                                 for t in tasks) + " |")
    lines.append(f"| MAS (no RL) <= {START_CAP} | " + " | ".join(_verdict(conds[t]["mas_start"], "mean {mean:.2f}")
                                                      for t in tasks) + " |")
    met = sum(all(conds[t][k] and conds[t][k]["met"] for k in ("above_single_grpo", "above_mas")) for t in tasks)
    starts = sum(bool(conds[t]["mas_start"] and conds[t]["mas_start"]["met"]) for t in tasks)
    lines += ["", f"Columns with the RL row above both baselines: {met} of {len(tasks)} ({COLUMNS_NEEDED} needed); "
              f"columns starting at or below {START_CAP}: {starts} of {len(tasks)} (all needed)."]
    cells = sorted({(t, r["from"].split()[0], s, v["precision"], v["cpu"], v["wall_seconds"])
                    for t in tasks for r in data["table"][t].values() for s, v in r["seeds"].items()})
    if cells:
        lines += ["", "| cell | precision | CPU | wall time |", "|---|---|---|---|"]
        lines += [f"| {t}/{r}/seed{s} | {p} | {cpu} | {w / 60:.1f} min |" for t, r, s, p, cpu, w in cells]
    if data["missing"]:
        lines += ["", f"Not run yet ({len(data['missing'])} cells): " + ", ".join(data["missing"])]
    if data.get("stale"):
        lines += ["", f"Stale, run with an earlier config and left out ({len(data['stale'])} cells): "
                  + ", ".join(data["stale"])]
    return "\n".join(lines) + "\n"


def _verdict(c: dict[str, Any] | None, detail: str) -> str:
    return "- (under 2 seeds)" if c is None else ("yes" if c["met"] else "no") + " (" + detail.format(**c) + ")"


def plot_curves(data: dict[str, Any], path: str) -> None:
    """One panel per task: each RL cell's held-out success at its evaluations (solid, markers; step 0 is the
    no-RL row's value) and its tree rollouts' success per step (dotted), colour by row, line style by seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = data["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.2), sharey=True)
    colours = {"single_grpo": "tab:gray", "mas_L1": "tab:blue", "mas_L3": "tab:orange"}
    for ax, task in zip(axes, tasks):
        for row, colour in colours.items():
            for i, (seed, cell) in enumerate(sorted(data["table"][task][row]["seeds"].items())):
                label = ROW_TITLES[row] if i == 0 else None
                ax.plot(*zip(*cell["evals"]), "o-", color=colour, alpha=1.0 if i == 0 else 0.6, label=label)
                if cell.get("rollout_success"):
                    ax.plot(*zip(*cell["rollout_success"]), ":", color=colour, alpha=0.6)
        ax.set_title(task)
        ax.set_xlabel("RL step")
        ax.set_ylim(-0.03, 1.03)
    axes[0].set_ylabel("success")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower left", ncol=3, fontsize=8)
    fig.text(0.99, 0.02, "solid: held-out, greedy (step 0: before RL); dotted: tree rollouts; pale: seed 1+",
             ha="right", fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(cells: list[dict[str, Any]], stale: list[str], directory: str, seeds: list[int] | None = None
                 ) -> dict[str, Any]:
    """Write ``table.json``, ``table.md`` and ``curves.png`` into ``directory``; returns the table."""
    data = assemble(cells, seeds, stale)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "table.json"), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    with open(os.path.join(directory, "table.md"), "w") as f:
        f.write(markdown(data))
    plot_curves(data, os.path.join(directory, "curves.png"))
    return data
