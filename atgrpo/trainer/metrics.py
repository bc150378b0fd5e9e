"""One logger for all metrics (slash names): metrics.jsonl, TensorBoard, console lines, and the PNG plot."""

from __future__ import annotations

import json
import math
import os
from typing import Any


class MetricsLogger:
    """Appends one JSON row per ``log`` to metrics.jsonl (and TensorBoard). ``rows``: start the file over with
    these rows (a fresh run: ``[]``; a resumed run: the rows of its checkpoint, which drops the rows logged
    after it); ``None`` appends to what is there. ``purge_step``: TensorBoard hides events of steps >= it."""

    def __init__(self, run_dir: str, tensorboard: bool = True, rows: list[dict[str, Any]] | None = None,
                 purge_step: int | None = None):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        if rows is not None:
            from .checkpoint import atomic_write_text

            atomic_write_text(self.path, "".join(_line(r) for r in rows))
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        with open(self.path, "a") as f:
            f.write(_line(row))
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def rss_mb() -> float:
    """Resident memory of this process in MiB (Linux: current VmRSS; elsewhere the peak, from getrusage)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_line(m: dict[str, Any]) -> str:
    """The one-line console summary of a step."""
    rewards = " ".join(f"{k.split('/')[-1]}={v:+.2f}" for k, v in sorted(m.items()) if k.startswith("rollout/reward/"))
    return (f"step {m['step']:>4} | success {m.get('rollout/success_rate', 0):.2f} | reward {rewards} | "
            f"zero-var {m.get('group/zero_variance_frac', 0):.2f} | loss {m.get('loss/pg', 0):+.4f} "
            f"clip {m.get('loss/clipfrac', 0):.3f} kl {m.get('loss/approx_kl', 0):.4f} | "
            f"{m.get('perf/tokens_per_s', 0):.0f} tok/s | {m.get('time/step', 0):.1f}s")


def plot_curves(run_dir: str, rows: list[dict[str, Any]], evals: list[tuple[int, float]]) -> str:
    """learning_curves.png: rollout success, reward per agent, and held-out success over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    steps = [r["step"] for r in rows]
    axes[0].plot(steps, [r.get("rollout/success_rate", 0) for r in rows], label="rollout (tree)")
    if evals:
        axes[0].plot([s for s, _ in evals], [v for _, v in evals], "o-", label="held-out eval (greedy)")
    axes[0].set_title("success rate")
    axes[0].set_ylim(0, 1)
    axes[0].legend()
    for key in sorted({k for r in rows for k in r if k.startswith("rollout/reward/")}):
        axes[1].plot(steps, [r.get(key, float("nan")) for r in rows], label=key.split("/")[-1])
    axes[1].set_title("mean candidate reward per agent")
    axes[1].legend()
    axes[2].plot(steps, [r.get("group/zero_variance_frac", 0) for r in rows], label="zero-variance groups")
    axes[2].plot(steps, [r.get("loss/clipfrac", 0) for r in rows], label="clipfrac")
    axes[2].set_title("groups and updates")
    axes[2].legend()
    for ax in axes:
        ax.set_xlabel("step")
    fig.tight_layout()
    path = os.path.join(run_dir, "learning_curves.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
