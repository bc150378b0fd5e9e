"""How a step's cost grows with the work: one axis at a time, log-log slopes, a plot per axis.

    atgrpo bench scale [--preset tiny|smollm2] [--quick] [--axes K,prompt,problems,turns,agents] [--out DIR]

Axes (the others at the preset's base shape): K (responses per prompt), prompt length (tokens), problems per
step (distinct prompts), turns and agents per team. Per point, interleaved repetitions, medians:

- rollout: the tree sampler as shipped against the per-branch baseline (each branch prefills its prompt, as the
  reference code's requests do). On K, prompt and problems it is one node, ``generate(prompts, n=K)`` (each
  prompt prefilled once, its K branches decoded together on one copy of its keys) against
  ``generate([prompt], n=1)`` per branch. On turns and agents it is a whole episode of a scripted team
  (``scale_team``: ``rollout.tree.tree_rollout`` over ``ScriptedTurns``, exactly turns x agents nodes, prompts
  growing with the kept transcript) against the same tree sampler asking each branch alone;
- update: the shared-prefix loss as shipped (each prompt runs once per group) against the per-sample loss (one
  sequence per sample), one forward + backward of the whole batch (``bench.update.loss_backward``): random
  responses on the node axes, the rollout's own samples on the team axes;
- step: rollout + update, as shipped (tree + shared prefix) and as the baselines (per-branch + per-sample);
- per method and step: tokens/s (tokens sampled, or scored by the update; a step's both over its seconds, as the
  trainer's ``perf/tokens_per_s``) and the phase's peak resident memory (``trainer/memory.py``; a step's: the
  higher of its two phases).

Each axis's log-log slope per method (the growth exponent: least squares of log seconds on log size) is in the
table: the tree sampler's prefill is flat in K and its decode linear, so its exponent in K sits below the
per-branch baseline's, which prefills K times; the shared-prefix update grows with K x response length, the
per-sample one with K x (prompt + response). A team's rollout runs turns x agents nodes one after the other, so
its exponent in either would be one at a fixed prompt; prompts that grow with the transcript put it above one.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import replace

import torch

from ..trainer.memory import phase
from .common import bench_prompts, interleaved, machine, make_policy, shape_dict, suppress_eos, write_report
from .scale_team import ScaleShape, team_methods, update_gflop, update_methods
from .update import make_batch

PRESETS = {
    "tiny": (ScaleShape(prompts=4, prompt_len=(128, 128), K=4, new_tokens=16, reps=3, warmup=1),
             {"K": [1, 2, 4, 8, 16, 32], "prompt": [64, 128, 256, 512, 1024], "problems": [1, 2, 4, 8, 16],
              "turns": [1, 2, 4, 8], "agents": [1, 2, 3, 4]}),
    # per-sample scoring two sequences at a time: 8 sequences of 2,064 tokens in one float32 micro-batch need more
    # than 24 GB of activations (a run of this preset was killed there); the shared prefix takes 16 responses a
    # micro-batch (``shared_prefix_algo``)
    "smollm2": (ScaleShape(prompts=2, prompt_len=(256, 256), K=4, new_tokens=16, reps=2, warmup=1,
                           model="smollm2-135m", micro_batch_size=2, token_budget=4096),
                # team axes shortened: one 4-node point (``measure`` at K = 2, 4 new tokens, 1 thread) took 27 s of
                # shared-prefix and 42 s of per-sample update, so 16 nodes at K = 4 would take most of an hour alone
                {"K": [1, 2, 4, 8, 16], "prompt": [64, 256, 1024, 2048], "problems": [1, 2, 4, 8],
                 "turns": [1, 2, 4], "agents": [1, 2, 3]}),
}
QUICK = {"K": [1, 4, 8], "prompt": [64, 256], "problems": [1, 4], "turns": [1, 2, 4], "agents": [1, 2, 3]}
TEAM_AXES = ("turns", "agents")  # timed on a whole team rollout (scale_team); the others on one node
METHODS = ("rollout_tree", "rollout_per_branch", "update_shared_prefix", "update_per_sample")
STEPS = {"step_shipped": ("rollout_tree", "update_shared_prefix"),
         "step_baseline": ("rollout_per_branch", "update_per_sample")}
LABELS = {"K": "K (responses per prompt)", "prompt": "prompt tokens", "problems": "problems",
          "turns": "turns (agents at the base)", "agents": "agents per team (turns at the base)"}


def shape_at(base: ScaleShape, axis: str, value: int) -> ScaleShape:
    if axis == "K":
        return replace(base, K=value)
    if axis == "prompt":
        return replace(base, prompt_len=(value, value))
    if axis == "problems":
        return replace(base, prompts=value)
    if axis == "turns":
        return replace(base, turns=value)
    if axis == "agents":
        return replace(base, agents=value)
    raise ValueError(f"unknown axis {axis!r}; axes: {', '.join(LABELS)}")


def node_methods(shape: ScaleShape, policy) -> tuple[dict, dict[str, int], dict]:
    """The four methods at one node (K, prompt, problems axes), the tokens each handles, and the point's info."""
    prompts = [policy.encode(t) for t in bench_prompts(shape, policy)]
    K, T = shape.K, shape.new_tokens
    gen = torch.Generator().manual_seed(shape.seed)
    batch_prompts, responses = make_batch(shape, policy)
    with torch.no_grad():
        old, _ = policy.response_logprobs(batch_prompts, responses, 1.0)
    adv = torch.randn(len(batch_prompts), generator=torch.Generator().manual_seed(shape.seed + 2))
    algo = shape.algo()

    methods = {
        "rollout_tree": lambda: policy.generate(prompts, K, 1.0, T, gen),
        "rollout_per_branch": lambda: [policy.generate([p], 1, 1.0, T, gen) for p in prompts for _ in range(K)],
        **update_methods(policy, batch_prompts, responses, old, adv, algo, algo),
    }
    tokens = len(prompts) * K * T
    return methods, dict.fromkeys(methods, tokens), {"nodes": 1, "samples": len(prompts) * K,
                                                     "update_gflop": update_gflop(policy, batch_prompts, responses)}


def measure(shape: ScaleShape, policy, axis: str) -> dict:
    """Seconds (median), tokens/s and peak RSS of each method and of both steps at one shape, and its info."""
    methods, tokens, info = (team_methods if axis in TEAM_AXES else node_methods)(shape, policy)
    peaks: dict[str, float] = {}

    def timed(name, fn):
        def run():
            with phase(name, peaks):
                fn()
        return run

    times = interleaved({m: timed(m, fn) for m, fn in methods.items()}, shape.reps, shape.warmup)
    policy.model.zero_grad(set_to_none=True)
    row: dict = {"info": info}
    for m in methods:
        s = statistics.median(times[m])
        row[m] = {"seconds": s, "tokens": tokens[m], "tokens_per_s": tokens[m] / s, "peak_rss_mb": peaks.get(m)}
    for step, parts in STEPS.items():
        s, n = sum(row[m]["seconds"] for m in parts), sum(row[m]["tokens"] for m in parts)
        mem = [row[m]["peak_rss_mb"] for m in parts if row[m]["peak_rss_mb"] is not None]
        row[step] = {"seconds": s, "tokens": n, "tokens_per_s": n / s, "peak_rss_mb": max(mem) if mem else None}
    return row


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two distinct points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def bench_scale(out_dir: str, preset: str = "tiny", quick: bool = False, axes: list[str] | None = None,
                threads: int | None = None, command: str | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    base, points = PRESETS[preset]
    if quick:
        base = replace(base, reps=1, warmup=1)
        points = {a: QUICK[a] for a in QUICK}
    axes = axes or list(points)
    unknown = [a for a in axes if a not in points]
    if unknown:
        raise ValueError(f"unknown axis {', '.join(unknown)}; axes: {', '.join(points)}")
    policy = make_policy(base)
    hook = suppress_eos(policy.model, policy.eos_id)
    base_shape = {"K": base.K, "prompt": base.prompt_len[0], "problems": base.prompts, "new_tokens": base.new_tokens,
                  "turns": base.turns, "agents": base.agents}
    result: dict = {"bench": "scale", "preset": preset, "quick": quick, "machine": machine(), "command": command,
                    "shape": shape_dict(base), "base": base_shape, "axes": {}}
    try:
        for axis in axes:
            rows = []
            for i, v in enumerate(points[axis]):
                shape = shape_at(base, axis, v)
                if quick and i:  # --quick: first-call costs are taken out once per axis, at its first point
                    shape = replace(shape, warmup=0)
                rows.append({"value": v, **measure(shape, policy, axis)})
            result["axes"][axis] = {"points": rows, "slopes": {
                m: slope([r["value"] for r in rows], [r[m]["seconds"] for r in rows]) for m in (*METHODS, *STEPS)}}
    finally:
        hook.remove()
    os.makedirs(out_dir, exist_ok=True)
    result["plots"] = {axis: plot_axis(out_dir, axis, result["axes"][axis]) for axis in result["axes"]}
    table = [(axis, m, _fmt_slope(a["slopes"][m]),
              " / ".join(f"{r['value']}: {r[m]['seconds']:.3g}s" for r in a["points"]))
             for axis, a in result["axes"].items() for m in (*METHODS, *STEPS)]
    notes = [(f"preset {preset}{' (quick)' if quick else ''}; base shape {json.dumps(result['base'])}; exponent = "
              "log-log slope of seconds on the axis; step_shipped = rollout_tree + update_shared_prefix, "
              "step_baseline = rollout_per_branch + update_per_sample"),
             ("turns, agents: one whole episode of a scripted team (turns x agents nodes, prompts growing with the "
              "transcript) and the update of its samples; K, prompt, problems: one node")]
    write_report(out_dir, "scale", result, table, ("axis", "method", "exponent", "seconds per point"), notes)
    with open(os.path.join(out_dir, "scale.md"), "a") as f:
        f.write("\n".join(point_table(result)) + "\n")
    return result


def point_table(result: dict) -> list[str]:
    """Every point: seconds, tokens/s and peak RSS (MiB) of each phase; shipped / baseline in each cell."""
    pairs = [("rollout s", "rollout_tree", "rollout_per_branch"), ("update s", "update_shared_prefix",
             "update_per_sample"), ("step s", "step_shipped", "step_baseline")]
    head = ["axis", "value", "nodes", "samples"] + [p[0] for p in pairs] + ["step tokens/s", "update GFLOP"] + [
        f"{p[0][:-2]} peak MiB" for p in pairs]
    lines = ["### Every point (as shipped / baseline: tree / per-branch, shared prefix / per-sample)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for axis, a in result["axes"].items():
        for r in a["points"]:
            cells = [axis, r["value"], r["info"]["nodes"], r["info"]["samples"]]
            cells += [f"{r[x]['seconds']:.3g} / {r[y]['seconds']:.3g}" for _, x, y in pairs]
            cells.append(f"{r['step_shipped']['tokens_per_s']:.0f} / {r['step_baseline']['tokens_per_s']:.0f}")
            flop = r["info"]["update_gflop"]
            cells.append(f"{flop['shared_prefix']:.3g} / {flop['per_sample']:.3g}")
            cells += [f"{_mib(r[x])} / {_mib(r[y])}" for _, x, y in pairs]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def _mib(entry: dict) -> str:
    return "-" if entry["peak_rss_mb"] is None else f"{entry['peak_rss_mb']:.0f}"


def _fmt_slope(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}"


def plot_axis(out_dir: str, axis: str, data: dict) -> str:
    """Cost against the axis, log-log, one line per method (the two steps dashed); returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs = [r["value"] for r in data["points"]]
    for m in (*METHODS, *STEPS):
        ys = [r[m]["seconds"] for r in data["points"]]
        ax.plot(xs, ys, marker="o", linestyle="--" if m in STEPS else "-",
                label=f"{m} (exponent {_fmt_slope(data['slopes'][m])})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_yscale("log")
    ax.set_xlabel(LABELS[axis])
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    path = os.path.join(out_dir, f"scale_{axis}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
