"""One logger for all metrics (slash names): metrics.jsonl, TensorBoard, console lines, and the PNG plot."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from typing import Any


class MetricsLogger:
    """Appends one JSON row per ``log`` to metrics.jsonl, and the same names and values to each backend of
    ``backends`` (``tensorboard``, ``wandb``, ``mlflow``: ``LOGGING_BACKENDS``). ``rows``: start the file over with
    these rows (a fresh run: ``[]``; a resumed run: the rows of its checkpoint, which drops the rows logged
    after it); ``None`` appends to what is there. ``purge_step``: TensorBoard hides events of steps >= it.
    ``logging``: the run's ``LoggingConfig`` (wandb / mlflow settings); ``params``: the resolved config, logged
    as the run's parameters (wandb config, mlflow params)."""

    def __init__(self, run_dir: str, tensorboard: bool = True, rows: list[dict[str, Any]] | None = None,
                 purge_step: int | None = None, logging: Any = None, params: dict[str, Any] | None = None):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        if rows is not None:
            from .atomic_files import atomic_write_text

            atomic_write_text(self.path, "".join(_line(r) for r in rows))
        backends = list(getattr(logging, "backends", ["tensorboard"]))
        self._tb = self._wandb = self._mlflow = None
        if tensorboard and "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=purge_step)
        flat = flatten(params or {})
        if "wandb" in backends:
            self._wandb = _start_wandb(run_dir, logging, flat)
        if "mlflow" in backends:
            self._mlflow = _start_mlflow(run_dir, logging, flat)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.append(step, metrics)
        self.to_backends(step, metrics)

    def append(self, step: int, metrics: dict[str, Any]) -> None:
        """The row to metrics.jsonl (one line, appended)."""
        with open(self.path, "a") as f:
            f.write(_line({"step": step, **metrics}))

    def to_backends(self, step: int, metrics: dict[str, Any]) -> None:
        """The row's finite numbers to TensorBoard, wandb, mlflow (those in use)."""
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._mlflow is not None:
            client, run_id = self._mlflow
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics_ = [Metric(k, v, now, step) for k, v in scalars.items()]
            for i in range(0, len(metrics_), 1000):  # the tracking API takes at most 1000 per batch
                client.log_batch(run_id, metrics=metrics_[i:i + 1000])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._mlflow is not None:
            client, run_id = self._mlflow
            client.set_terminated(run_id)
            self._mlflow = None


LOGGING_BACKENDS = ("tensorboard", "wandb", "mlflow")
_IDS_FILE = "logging_ids.json"  # the wandb / mlflow run ids of this run directory: a resumed run continues them


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> dotted keys (``algo.lr``); lists and other values as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _ids(run_dir: str) -> dict[str, str]:
    try:
        with open(os.path.join(run_dir, _IDS_FILE)) as f:
            ids = json.load(f)
        return ids if isinstance(ids, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_id(run_dir: str, backend: str, run_id: str) -> None:
    from .atomic_files import atomic_write_text

    ids = {**_ids(run_dir), backend: run_id}
    atomic_write_text(os.path.join(run_dir, _IDS_FILE), json.dumps(ids, indent=1) + "\n")


def _run_name(run_dir: str, logging: Any) -> str:
    return getattr(logging, "run_name", None) or os.path.basename(os.path.abspath(run_dir))


def _start_wandb(run_dir: str, logging: Any, params: dict[str, Any]):
    """A wandb run in ``RUN_DIR/wandb`` (mode ``logging.wandb_mode``: offline by default, no network; sync it
    later with ``wandb sync``). A resumed run continues the same wandb run id."""
    import wandb

    run_id = _ids(run_dir).get("wandb") or uuid.uuid4().hex[:12]
    d = os.path.join(run_dir, "wandb")
    os.makedirs(d, exist_ok=True)
    run = wandb.init(project=getattr(logging, "project", "atgrpo"), name=_run_name(run_dir, logging), id=run_id,
                     resume="allow", dir=d, mode=getattr(logging, "wandb_mode", "offline"), config=params,
                     settings=wandb.Settings(silent=True, console="off"))
    _save_id(run_dir, "wandb", run_id)
    return run


def mlflow_uri(run_dir: str, logging: Any) -> str:
    """``logging.mlflow_tracking_uri``, else a file store in the run directory (``file:RUN_DIR/mlruns``)."""
    return getattr(logging, "mlflow_tracking_uri", None) or "file:" + os.path.join(os.path.abspath(run_dir), "mlruns")


def _start_mlflow(run_dir: str, logging: Any, params: dict[str, Any]):
    """An MLflow run in experiment ``logging.project`` of the tracking store (default: a local ``file:`` store
    in the run directory). The resolved config is logged as its params; a resumed run continues the same run."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri(run_dir, logging)
    if uri.startswith("file:"):  # MLflow 3 keeps its file store in maintenance mode and asks for this opt-in
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    run_id = _ids(run_dir).get("mlflow")
    if run_id is None:
        name = getattr(logging, "project", "atgrpo")
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        run_id = client.create_run(exp_id, run_name=_run_name(run_dir, logging)).info.run_id
        ps = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(params.items())]
        for i in range(0, len(ps), 100):  # the tracking API takes at most 100 params per batch
            client.log_batch(run_id, params=ps[i:i + 100])
        _save_id(run_dir, "mlflow", run_id)
    else:
        client.update_run(run_id, status="RUNNING")
    return client, run_id


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
    """The one-line console summary of a step (``ref-kl``: the distance to the KL penalty's reference, when
    there is one)."""
    rewards = " ".join(f"{k.split('/')[-1]}={v:+.2f}" for k, v in sorted(m.items()) if k.startswith("rollout/reward/"))
    ref_kl = f" ref-kl {m['loss/ref_kl']:.4f}" if "loss/ref_kl" in m else ""
    return (f"step {m['step']:>4} | success {m.get('rollout/success_rate', 0):.2f} | reward {rewards} | "
            f"zero-var {m.get('group/zero_variance_frac', 0):.2f} | loss {m.get('loss/pg', 0):+.4f} "
            f"clip {m.get('loss/clipfrac', 0):.3f} kl {m.get('loss/approx_kl', 0):.4f}{ref_kl} | "
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
