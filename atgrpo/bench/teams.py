"""``atgrpo bench teams``: what a third agent adds, in miniature (tiny policies, compact prompts, CPU).

The math team of two (tool agent + reasoner, ``math``) against the team of three (tool agent + reasoner +
verifier, ``math_verify``: the verifier accepts the reasoner's answer or sends it back), each trained with
AT-GRPO with one shared policy (L1) and with one policy per role (L3), same problems, same warm start size,
same steps and K. The budget is sampled responses: the team of three acts three times in its first turn where
the team of two acts twice, so the team of two gets 3/2 the problems per step; every run reports what it
sampled. Each cell is the held-out greedy success rate after RL (and before it: the warm start alone), mean and
std over seeds.

Writes ``results.json`` and ``results.md`` into the output directory, one run directory per cell under ``runs/``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from .learning import COMMON, RECIPE, TASKS, run_cells

# the learning bench's math task (arithmetic, 2-3 terms of 1-2 digits, compact prompts, up to 3 turns, its warm
# start), its environment chosen per team
MATH = [i for i in TASKS["math"] if not i.startswith("env.name=")] + ["rollout.K=4"]
TEAMS: dict[str, tuple[str, int]] = {  # team -> (environment, problems per step)
    "two roles (tool, reasoner)": ("math", 12),
    "three roles (tool, reasoner, verifier)": ("math_verify", 8),
}
SHARING = {"shared policy (L1)": "L1", "one policy per role (L3)": "L3"}
SIZES: dict[str, dict[str, Any]] = {
    # lr 5e-5: at the default 2e-4 the tiny math team of two fell from 0.40 / 0.65 to 0.12 in 10 steps (seeds 0,
    # 1: its byte-level copying of digits broke); at 5e-5 it holds (0.40 -> 0.33)
    "default": {"seeds": 3, "overrides": ["train.steps=10", "eval.problems=60", "eval.every=5", "algo.lr=5e-5"]},
    "quick": {"seeds": 1, "overrides": ["train.steps=1", "warmstart.episodes=16", "warmstart.epochs=1",
                                        "eval.problems=4", "eval.every=0"]},
}


def cell_overrides(team: str, sharing: str, size: str, seed: int) -> list[str]:
    env, problems = TEAMS[team]
    if size == "quick":
        problems = problems // 4
    return ([f"env.name={env}"] + MATH + [f"policy.sharing={SHARING[sharing]}", f"rollout.problems_per_step={problems}"]
            + RECIPE + SIZES[size]["overrides"] + COMMON + [f"seed={seed}"])


def run_teams_bench(out: str, size: str = "default", seeds: int | None = None, jobs: int | None = None,
                    progress: bool = True) -> dict[str, Any]:
    n_seeds = seeds or SIZES[size]["seeds"]
    os.makedirs(out, exist_ok=True)
    cells = [({"team": team, "sharing": sharing, "seed": seed}, cell_overrides(team, sharing, size, seed))
             for team in TEAMS for sharing in SHARING for seed in range(n_seeds)]
    start = time.time()
    runs, failed = run_cells(cells, out, jobs or os.cpu_count() or 1, progress)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for team in TEAMS:
        table[team] = {}
        for sharing in SHARING:
            own = [r for r in runs if r["team"] == team and r["sharing"] == sharing]
            if own:
                table[team][sharing] = {k: statistics.fmean(r[k] for r in own) for k in ("before", "after", "samples")}
                table[team][sharing]["std"] = statistics.pstdev([r["after"] for r in own]) if len(own) > 1 else 0.0
                table[team][sharing]["n"] = len(own)
    result = {"size": size, "seeds": n_seeds, "table": table, "runs": runs, "failed": failed,
              "wall_seconds": time.time() - start,
              "command": f"atgrpo bench teams{' --quick' if size == 'quick' else ''}"
                         f"{f' --seeds {seeds}' if seeds else ''} --out {out}"}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Math (arithmetic, compact prompts, tiny policies): held-out greedy success (%) after RL, mean ± std "
             f"over {result['seeds']} seed(s), the warm start alone in brackets; command: `{result['command']}`; "
             f"{result['wall_seconds'] / 60:.1f} min.", ""]
    for f in result.get("failed", []):
        lines.append(f"**FAILED, left out**: {f['team']} / {f['sharing']} / seed {f['seed']}: {f['error']}")
    lines += ["| team | " + " | ".join(SHARING) + " | sampled responses per run |",
              "|---|" + "---|" * (len(SHARING) + 1)]
    for team, cells in result["table"].items():
        vals = [f"{100 * c['after']:.1f} ± {100 * c['std']:.1f} ({100 * c['before']:.1f})" if (c := cells.get(s))
                else "-" for s in SHARING]
        budget = " / ".join(f"{cells[s]['samples']:.0f}" for s in SHARING if s in cells)
        lines.append(f"| {team} | " + " | ".join(vals) + f" | {budget} |")
    return "\n".join(lines) + "\n"
