"""Step time of the local backend vs the Ray backend on a short quickstart-like run, measured side by side.

Two train states of the same config and seed, one per backend, step in alternation (local step 1, Ray step 1,
local step 2, ...), so load from other processes hits both alike. Reports the Ray start-up (cluster, actors,
first weight push), the median step / rollout / update time of each backend over steps 2..N (step 1 of the Ray
backend waits for its actors), and how far the two runs' metrics are apart (same seed: equal rewards).

    python benchmarks/bench_backends.py --steps 6 --out bench_out/backends.json
    python benchmarks/bench_backends.py --steps 6 --set policy.sharing=L3 --set system.ray.num_update_workers=2

Defaults: the quickstart (tiny model, two-agent Plan-Path, K=8, 16 problems per step) without warm start, and
every Ray worker at 1/4 CPU so that the local cluster fits on a 2-core machine (``--set`` overrides anything).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from atgrpo.config import load_config  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from atgrpo.trainer.step import train_step  # noqa: E402

DEFAULTS = ["warmstart.enabled=false", "system.backend=ray", "system.ray.cpus_per_worker=0.25",
            "system.ray.cpus_per_env_worker=0.25"]
TIMES = ("time/step", "time/rollout", "time/update", "time/ray_sync")


def run(steps: int, overrides: list[str]) -> dict:
    import ray

    from atgrpo.trainer.ray.driver import RayBackend

    cfg = load_config(None, DEFAULTS + overrides)
    local, remote = build_state(cfg), build_state(cfg)
    t = time.perf_counter()
    ray.init(num_cpus=cfg.system.ray.num_cpus, include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t
    remote.backend = RayBackend(cfg)
    remote.backend.attach(remote)  # waits for every actor, forms the process groups, pushes the weights
    startup = time.perf_counter() - t
    rows: dict[str, list[dict]] = {"local": [], "ray": []}
    worst = {"reward": 0.0, "loss_rel": 0.0}
    try:
        for step in range(1, steps + 1):
            ml, mr = train_step(local, step).metrics(), train_step(remote, step).metrics()
            rows["local"].append(ml)
            rows["ray"].append(mr)
            for k, a in ml.items():
                if k.startswith("rollout/reward"):
                    worst["reward"] = max(worst["reward"], abs(a - mr[k]))
                if k.startswith("update/") and k.endswith("/loss"):
                    worst["loss_rel"] = max(worst["loss_rel"], abs(a - mr[k]) / max(abs(a), 1e-6))
            print(f"step {step}: local {ml['time/step']:.2f}s  ray {mr['time/step']:.2f}s  "
                  f"reward/{'=' if worst['reward'] == 0 else '!='}  dropped {mr['ray/dropped_samples']:.0f}",
                  flush=True)
    finally:
        remote.backend.close()
        ray.shutdown()
    summary = {}
    for name, rs in rows.items():
        later = rs[1:] or rs
        summary[name] = {k: statistics.median(r.get(k, 0.0) for r in later) for k in TIMES}
        summary[name]["step1"] = rs[0]["time/step"]
        summary[name]["tokens_per_s"] = statistics.median(r["perf/tokens_per_s"] for r in later)
    return {"steps": steps, "overrides": DEFAULTS + overrides, "ray_init_s": t_init, "ray_startup_s": startup,
            "backends": summary, "max_abs_reward_diff": worst["reward"], "max_rel_loss_diff": worst["loss_rel"],
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_avg_1m_at_end": os.getloadavg()[0]}, "local_torch_threads": torch.get_num_threads()}


def table(res: dict) -> str:
    lines = ["| backend | step 1 (s) | step, median of 2..N (s) | rollout (s) | update (s) | weight sync (s) | "
             "tokens/s |", "|---|---|---|---|---|---|---|"]
    for name, s in res["backends"].items():
        lines.append(f"| {name} | {s['step1']:.2f} | {s['time/step']:.2f} | {s['time/rollout']:.2f} | "
                     f"{s['time/update']:.2f} | {s['time/ray_sync']:.3f} | {s['tokens_per_s']:.0f} |")
    lines.append(f"\nlocal backend: {res['local_torch_threads']} torch thread(s); load average at the end "
                 f"{res['machine']['load_avg_1m_at_end']:.1f} on {res['machine']['cpus']} CPUs")
    lines.append(f"Ray start-up (ray.init + actors + first weight push): {res['ray_startup_s']:.1f}s "
                 f"(ray.init {res['ray_init_s']:.1f}s); max |reward diff| {res['max_abs_reward_diff']:.2g}, "
                 f"max rel loss diff {res['max_rel_loss_diff']:.2g}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of this process (the local backend's compute; Ray workers get theirs from "
                         "their CPU reservation). Default: torch's (the number of cores)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    res = run(args.steps, args.set)
    print(table(res))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
