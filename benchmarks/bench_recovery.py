"""The cost of a recovery (Ray backend, ``system.ray.max_failures``, docs/ray.md "Recovery").

The same short run twice on one local Ray instance: undisturbed, then with an update worker SIGKILLed in the
middle of its update at step ``--fail-at`` (a forward hook armed through Ray, as tests/test_ray_recovery.py does).
Reports both runs' wall time, the recovery's ``seconds_lost`` (summary.json: from the end of the last checkpoint
until the pools were rebuilt and the state restored), the wall time the recovery added in all (that plus the
redone steps and the new workers' start), and whether the two runs wrote the same rows (timings aside).

    python benchmarks/bench_recovery.py --steps 6 --checkpoint-every 2 --fail-at 6

Defaults: the tiny test model (hidden 32, one layer), 4 problems x K=4 per step, no warm start, 1 rollout + 2
update workers and 1 environment worker at 1/8 CPU each on a 2-CPU local Ray instance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import atgrpo.trainer.run as run_module  # noqa: E402
from atgrpo.config import load_config  # noqa: E402

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "rollout.K=4", "rollout.problems_per_step=4", "rollout.max_new_tokens=8",
        "warmstart.enabled=false", "eval.problems=2", "train.tensorboard=false", "train.plot=false",
        "system.backend=ray", "system.ray.cpus_per_worker=0.125", "system.ray.cpus_per_env_worker=0.125",
        "system.ray.num_env_workers=1", "system.ray.num_update_workers=2"]


def _die_mid_update(worker):
    """Runs in the update worker: its next forward with gradients SIGKILLs its process."""
    import signal

    import torch

    def hook(module, inputs, output):
        if torch.is_grad_enabled():
            os.kill(os.getpid(), signal.SIGKILL)
        return output
    worker.policy.model.get_output_embeddings().register_forward_hook(hook)


def _run(items: list[str], out: str, fail_at: int | None) -> tuple[float, dict]:
    import ray

    real = run_module.train_step

    def train_step(state, n):
        if n == fail_at and not armed:
            armed.append(n)
            ray.get(state.backend.pools["shared"].update[-1].__ray_call__.remote(_die_mid_update))
        return real(state, n)
    armed: list[int] = []
    run_module.train_step = train_step
    try:
        t = time.time()
        summary = run_module.train(load_config(None, items), out, progress=False)
        return time.time() - t, summary
    finally:
        run_module.train_step = real


def _rows(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/", "ray/recoveries"))}
                for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--fail-at", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    items = TINY + [f"train.steps={args.steps}", f"train.checkpoint_every={args.checkpoint_every}", *args.set]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wall_ref, _ = _run(items, os.path.join(tmp, "undisturbed"), None)
            wall, summary = _run(items, os.path.join(tmp, "recovered"), args.fail_at)
            same = _rows(os.path.join(tmp, "recovered")) == _rows(os.path.join(tmp, "undisturbed"))
    finally:
        ray.shutdown()
    print(json.dumps({"undisturbed_wall_s": round(wall_ref, 1), "recovered_wall_s": round(wall, 1),
                      "added_wall_s": round(wall - wall_ref, 1),
                      "recoveries": [{**r, "seconds_lost": round(r["seconds_lost"], 1)} for r in summary["recoveries"]],
                      "rows_equal": same, "load_average": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
