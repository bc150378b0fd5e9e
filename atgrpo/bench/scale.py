"""How a step's cost grows with the work: one axis at a time, log-log slopes, a plot per axis.

    atgrpo bench scale [--preset tiny|smollm2] [--quick] [--axes K,prompt,problems] [--out DIR]

Axes (the others at the preset's base shape): K (responses per prompt), prompt length (tokens), problems per
step (distinct prompts). Per point, interleaved repetitions, medians:

- rollout: the tree sampler as shipped (``generate(prompts, n=K)``: each prompt prefilled once, its K branches
  decoded together on one copy of its keys) against the per-branch baseline (``generate([prompt], n=1)`` for each
  branch: the prompt prefilled K times, as the reference code's requests do);
- update: the shared-prefix loss as shipped (each prompt runs once per group) against the per-sample loss (one
  sequence per sample), one forward + backward of the whole batch (``bench.update.loss_backward``);
- the peak resident memory of each (``trainer/memory.py``).

Each axis's log-log slope per method (the growth exponent: least squares of log seconds on log size) is in the
table: the tree sampler's prefill is flat in K and its decode linear, so its exponent in K sits below the
per-branch baseline's, which prefills K times; the shared-prefix update grows with K x response length, the
per-sample one with K x (prompt + response). Turns and team size are not axes yet.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import replace

import torch

from ..trainer.memory import phase
from .common import (Shape, bench_prompts, interleaved, machine, make_policy, shape_dict, suppress_eos,
                     write_report)
from .update import loss_backward, make_batch

PRESETS = {
    "tiny": (Shape(prompts=4, prompt_len=(128, 128), K=4, new_tokens=16, reps=3, warmup=1),
             {"K": [1, 2, 4, 8, 16, 32], "prompt": [64, 128, 256, 512, 1024], "problems": [1, 2, 4, 8, 16]}),
    # per-sample scoring two sequences at a time: 8 sequences of 2,064 tokens in one float32 micro-batch need more
    # than 24 GB of activations (a run of this preset was killed there)
    "smollm2": (Shape(prompts=2, prompt_len=(256, 256), K=4, new_tokens=16, reps=2, warmup=1, model="smollm2-135m",
                      micro_batch_size=2, token_budget=4096),
                {"K": [1, 2, 4, 8, 16], "prompt": [64, 256, 1024, 2048], "problems": [1, 2, 4, 8]}),
}
QUICK = {"K": [1, 4, 8], "prompt": [64, 256], "problems": [1, 4]}
METHODS = ("rollout_tree", "rollout_per_branch", "update_shared_prefix", "update_per_sample")


def shape_at(base: Shape, axis: str, value: int) -> Shape:
    if axis == "K":
        return replace(base, K=value)
    if axis == "prompt":
        return replace(base, prompt_len=(value, value))
    if axis == "problems":
        return replace(base, prompts=value)
    raise ValueError(f"unknown axis {axis!r}; axes: K, prompt, problems")


def measure(shape: Shape, policy) -> dict[str, dict]:
    """Seconds (median) and peak RSS of each method at one shape."""
    prompts = [policy.encode(t) for t in bench_prompts(shape, policy)]
    K, T = shape.K, shape.new_tokens
    gen = torch.Generator().manual_seed(shape.seed)
    batch_prompts, responses = make_batch(shape, policy)
    with torch.no_grad():
        old, _ = policy.response_logprobs(batch_prompts, responses, 1.0)
    adv = torch.randn(len(batch_prompts), generator=torch.Generator().manual_seed(shape.seed + 2))
    algo = shape.algo()
    peaks: dict[str, float] = {}

    def timed(name, fn):
        def run():
            with phase(name, peaks):
                fn()
        return run

    def update(shared):
        def f():
            policy.model.zero_grad(set_to_none=True)
            loss_backward(policy, batch_prompts, responses, old, adv, shared, algo)
        return f

    methods = {
        "rollout_tree": timed("rollout_tree", lambda: policy.generate(prompts, K, 1.0, T, gen)),
        "rollout_per_branch": timed("rollout_per_branch", lambda: [policy.generate([p], 1, 1.0, T, gen)
                                                                   for p in prompts for _ in range(K)]),
        "update_shared_prefix": timed("update_shared_prefix", update(True)),
        "update_per_sample": timed("update_per_sample", update(False)),
    }
    times = interleaved(methods, shape.reps, shape.warmup)
    policy.model.zero_grad(set_to_none=True)
    return {m: {"seconds": statistics.median(times[m]), "peak_rss_mb": peaks.get(m)} for m in methods}


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
    policy = make_policy(base)
    hook = suppress_eos(policy.model, policy.eos_id)
    base_shape = {"K": base.K, "prompt": base.prompt_len[0], "problems": base.prompts, "new_tokens": base.new_tokens}
    result: dict = {"bench": "scale", "preset": preset, "quick": quick, "machine": machine(), "command": command,
                    "shape": shape_dict(base), "base": base_shape, "axes": {}}
    try:
        for axis in axes:
            rows = []
            for value in points[axis]:
                rows.append({"value": value, **measure(shape_at(base, axis, value), policy)})
            result["axes"][axis] = {"points": rows, "slopes": {
                m: slope([r["value"] for r in rows], [r[m]["seconds"] for r in rows]) for m in METHODS}}
    finally:
        hook.remove()
    os.makedirs(out_dir, exist_ok=True)
    result["plots"] = {axis: plot_axis(out_dir, axis, result["axes"][axis]) for axis in result["axes"]}
    table = [(axis, m, _fmt_slope(a["slopes"][m]),
              " / ".join(f"{r['value']}: {r[m]['seconds']:.3g}s" for r in a["points"]))
             for axis, a in result["axes"].items() for m in METHODS]
    notes = [f"preset {preset}{' (quick)' if quick else ''}; base shape {json.dumps(result['base'])}; exponent = "
             f"log-log slope of seconds on the axis"]
    write_report(out_dir, "scale", result, table, ("axis", "method", "exponent", "seconds per point"), notes)
    return result


def _fmt_slope(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}"


def plot_axis(out_dir: str, axis: str, data: dict) -> str:
    """Cost against the axis, log-log, one line per method; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs = [r["value"] for r in data["points"]]
    for m in METHODS:
        ys = [r[m]["seconds"] for r in data["points"]]
        ax.plot(xs, ys, marker="o", label=f"{m} (exponent {_fmt_slope(data['slopes'][m])})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel({"K": "K (responses per prompt)", "prompt": "prompt tokens", "problems": "problems"}[axis])
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    path = os.path.join(out_dir, f"scale_{axis}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
