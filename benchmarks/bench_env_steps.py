"""Step times of the code and math environments with two sandbox implementations, side by side.

The scripted expert's step (code: the coder's reference solution run on its hidden tests on the shared
pool; math: the tool agent's program run once) is timed with ``atgrpo.sandbox`` from this checkout and
with ``atgrpo/sandbox`` as it was at git revision ``--baseline`` (see ``bench_sandbox.load_baseline``), in
alternating rounds, the result cache cleared before every step so that every program really runs.
Prints the median and mean milliseconds per step and writes JSON to ``--out``.

    python benchmarks/bench_env_steps.py --steps 20 --rounds 3 --baseline main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from atgrpo import sandbox  # noqa: E402
from atgrpo.envs import make, programs  # noqa: E402
from bench_sandbox import load_baseline  # noqa: E402


def use(sbx) -> None:
    """Point the environments' program runner at the sandbox module ``sbx``."""
    programs.run_python, programs.SandboxPool = sbx.run_python, sbx.SandboxPool
    if programs._pool is not None:
        programs._pool.close()
    programs._pool = None
    programs.clear_cache()


def code_steps(n: int, seed0: int) -> list[float]:
    env = make("code", style="chat", split="train", cache=False)
    times = []
    for s in range(seed0, seed0 + n):
        env.reset(s)
        action = env.expert_action("coder")
        t0 = time.perf_counter()
        env.step(action)
        times.append(time.perf_counter() - t0)
        assert env.success, s
    return times


def math_steps(n: int, seed0: int) -> list[float]:
    env = make("math", style="chat", split="train")
    times = []
    for s in range(seed0, seed0 + n):
        env.reset(s)
        action = env.expert_action("tool")
        programs.clear_cache()
        t0 = time.perf_counter()
        env.step(action)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--out", default="bench_out/env_steps.json")
    args = parser.parse_args()
    impls = [(f"sandbox at {args.baseline}", load_baseline(args.baseline)), ("this checkout", sandbox)]
    times = {(name, env): [] for name, _ in impls for env in ("code", "math")}
    for name, sbx in impls:  # warm up
        use(sbx)
        code_steps(2, 10_000)
        math_steps(2, 10_000)
    for r in range(args.rounds):
        for env, fn in (("code", code_steps), ("math", math_steps)):
            for name, sbx in impls:
                use(sbx)
                times[(name, env)] += fn(args.steps, 100 * r)
    rows = [{"implementation": name, "env": env, "steps": len(t), "median_ms": round(1000 * statistics.median(t), 1),
             "mean_ms": round(1000 * statistics.mean(t), 1)} for (name, env), t in times.items()]
    print(f"cpus: {os.cpu_count()}, load average {[round(x, 2) for x in os.getloadavg()]}\n")
    print("| env | implementation | steps | median ms/step | mean ms/step |\n|---|---|---:|---:|---:|")
    for row in sorted(rows, key=lambda r: r["env"]):
        print(f"| {row['env']} | {row['implementation']} | {row['steps']} | {row['median_ms']} | {row['mean_ms']} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"baseline": args.baseline, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
