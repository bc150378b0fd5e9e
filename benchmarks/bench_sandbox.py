"""Throughput of atgrpo.sandbox: executions per second of a trivial program.

Runs ``print(1)`` N times one at a time, then through SandboxPool with 2 and 4
workers (and, as a reference, a bare ``python -I -c`` subprocess with no sandbox),
all in one process, prints a markdown table and writes JSON to ``--out``.

    python benchmarks/bench_sandbox.py --runs 100 --out bench_out/sandbox.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from atgrpo import sandbox  # noqa: E402
from atgrpo.sandbox import SandboxPool, run_python  # noqa: E402

CODE = "print(1)"


def cpu_seconds() -> float:
    """CPU time of this process plus all reaped descendants (robust to a busy machine)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def bare(runs: int) -> None:
    for _ in range(runs):
        subprocess.run([sys.executable, "-I", "-c", CODE], capture_output=True, check=True)


def sequential(runs: int) -> None:
    for _ in range(runs):
        assert run_python(CODE).stdout == "1\n"


def pooled(workers: int):
    def go(runs: int) -> None:
        with SandboxPool(max_workers=workers) as pool:
            assert all(r.stdout == "1\n" for r in pool.map([(CODE, "", 5.0)] * runs))
    return go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="executions per configuration")
    parser.add_argument("--out", default="bench_out/sandbox.json")
    args = parser.parse_args()

    iso = sandbox.isolation()
    load_before = os.getloadavg()
    sequential(3)  # warm up (isolation probe, page cache)
    configs = [("bare subprocess (no sandbox)", 1, bare), ("sandbox, one at a time", 1, sequential),
               ("SandboxPool", 2, pooled(2)), ("SandboxPool", 4, pooled(4))]
    rows = []
    for name, workers, fn in configs:
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn(args.runs)
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        rows.append({"mode": name, "workers": workers, "runs": args.runs, "seconds": round(seconds, 3),
                     "exec_per_s": round(args.runs / seconds, 1), "ms_per_exec": round(1000 * seconds / args.runs, 2),
                     "cpu_ms_per_exec": round(1000 * cpu / args.runs, 2)})
    base = next(r["exec_per_s"] for r in rows if r["mode"] == "sandbox, one at a time")
    for r in rows:
        r["speedup_vs_sequential"] = round(r["exec_per_s"] / base, 2)

    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    print(f"isolation: {iso}\ncpus: {os.cpu_count()}, python {platform.python_version()}, "
          f"load average (1/5/15 min) before {load['before']}, after {load['after']}\n")
    print("| mode | workers | runs | seconds | exec/s | ms/exec (wall) | CPU ms/exec | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['workers']} | {r['runs']} | {r['seconds']:.2f} | {r['exec_per_s']:.1f} "
              f"| {r['ms_per_exec']:.1f} | {r['cpu_ms_per_exec']:.1f} | {r['speedup_vs_sequential']:.2f}x |")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"program": CODE, "cpus": os.cpu_count(), "python": platform.python_version(),
                   "kernel": platform.release(), "loadavg": load, "isolation": {
                       "namespaces": iso.namespaces, "network": iso.network,
                       "drop_privileges": iso.drop_privileges}, "results": rows}, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
