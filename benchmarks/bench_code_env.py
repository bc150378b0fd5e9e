"""Throughput of the code environment with scripted agents: episodes per second, pool vs sequential tests.

Two scripted episodes on generated training problems (distinct seeds, result cache off, so every program run is
a real sandbox execution):
- ``expert``: the coder writes the reference solution at once (8 hidden tests; the episode ends on success);
- ``fix``: the coder first writes a wrong program (``print('?')``), the tester answers with the generator's valid
  cases (each run on the reference and on the program), then the coder writes the reference solution:
  8 + 6 + 8 = 22 sandbox runs over three steps.
Each is run with the hidden / tester cases executed one by one and on the shared ``SandboxPool`` (parallel).
Prints a markdown table and writes JSON to ``--out``.

    python benchmarks/bench_code_env.py --episodes 20 --out bench_out/code_env.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from atgrpo import sandbox  # noqa: E402
from atgrpo.envs import make  # noqa: E402
from atgrpo.envs.programs import run_jobs, shared_pool  # noqa: E402

WRONG = "```python\nprint('?')\n```"  # no problem expects '?': the tester always exposes it


def episode(env, kind: str) -> int:
    """Play one scripted episode; return the number of steps."""
    steps = 0
    if kind == "fix":
        env.step(WRONG)
        env.step(env.expert_action("tester"))
        steps += 2
    r = env.step(env.expert_action("coder"))
    assert r.terminated and env.success, f"the expert coder must solve {env.problem_id}"
    return steps + 1


def measure(kind: str, parallel: bool, episodes: int, first_seed: int) -> dict:
    env = make("code", style="chat", split="train", parallel=parallel, cache=False)
    steps, runs, t0 = 0, 0, time.perf_counter()
    for s in range(first_seed, first_seed + episodes):
        env.reset(s)
        steps += episode(env, kind)
        runs += len(env.problem.tests) * (2 if kind == "fix" else 1) + (2 * len(env.tests) if kind == "fix" else 0)
    seconds = time.perf_counter() - t0
    return {"episode": kind, "tests": "pool" if parallel else "sequential", "episodes": episodes, "steps": steps,
            "sandbox_runs": runs, "seconds": round(seconds, 3), "episodes_per_s": round(episodes / seconds, 2),
            "ms_per_episode": round(1000 * seconds / episodes, 1), "runs_per_s": round(runs / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20, help="episodes per configuration")
    parser.add_argument("--out", default="bench_out/code_env.json")
    args = parser.parse_args()

    iso = sandbox.isolation()
    run_jobs([("print(1)", "", 5.0)] * 2, cache=False)  # warm up: isolation probe, the shared pool, page cache
    workers = shared_pool()._executor._max_workers
    load_before = os.getloadavg()
    rows = []
    for n, (kind, parallel) in enumerate([("expert", False), ("expert", True), ("fix", False), ("fix", True)]):
        rows.append(measure(kind, parallel, args.episodes, first_seed=1000 * n))
    for r in rows:
        base = next(b for b in rows if b["episode"] == r["episode"] and b["tests"] == "sequential")
        r["speedup"] = round(r["episodes_per_s"] / base["episodes_per_s"], 2)
    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    print(f"isolation: {iso}\ncpus: {os.cpu_count()}, pool workers: {workers}, python {platform.python_version()}, "
          f"load average before {load['before']}, after {load['after']}\n")
    print("| episode | tests run | episodes | sandbox runs | seconds | episodes/s | ms/episode | runs/s | speedup |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['episode']} | {r['tests']} | {r['episodes']} | {r['sandbox_runs']} | {r['seconds']:.2f} | "
              f"{r['episodes_per_s']:.2f} | {r['ms_per_episode']:.0f} | {r['runs_per_s']:.1f} | {r['speedup']:.2f}x |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cpus": os.cpu_count(), "pool_workers": workers, "python": platform.python_version(),
                   "loadavg": load, "isolation": {"namespaces": iso.namespaces, "network": iso.network,
                                                  "drop_privileges": iso.drop_privileges}, "results": rows}, f,
                  indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
