"""Throughput of atgrpo.sandbox: executions per second of a trivial program.

Runs ``print(1)`` N times one at a time, then through SandboxPool with 2 and 4
workers (and, as a reference, a bare ``python -I -c`` subprocess with no sandbox),
all in one process, prints a markdown table and writes JSON to ``--out``.

    python benchmarks/bench_sandbox.py --runs 100 --out bench_out/sandbox.json

``--baseline REF`` also loads ``atgrpo/sandbox`` as it was at git revision REF (exported to a temporary
package) and measures both in alternating rounds, so that a busy machine weighs on both alike:

    python benchmarks/bench_sandbox.py --runs 100 --rounds 3 --baseline main
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import resource
import shutil
import importlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from atgrpo import sandbox  # noqa: E402

CODE = "print(1)"


def cpu_seconds() -> float:
    """CPU time of this process plus all reaped descendants (robust to a busy machine)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def bare(runs: int) -> None:
    for _ in range(runs):
        subprocess.run([sys.executable, "-I", "-c", CODE], capture_output=True, check=True)


def sequential(runs: int, sbx=None) -> None:
    run = (sbx or sandbox).run_python
    for _ in range(runs):
        assert run(CODE).stdout == "1\n"


def pooled(workers: int, sbx=None):
    def go(runs: int) -> None:
        with (sbx or sandbox).SandboxPool(max_workers=workers) as pool:
            assert all(r.stdout == "1\n" for r in pool.map([(CODE, "", 5.0)] * runs))
    return go


def load_baseline(ref: str):
    """``atgrpo/sandbox`` at git revision ``ref``, imported as a separate package."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="atgrpo-bench-baseline-")
    atexit.register(shutil.rmtree, tmp, True)
    os.chmod(tmp, 0o755)
    pkg = os.path.join(tmp, "atgrpo_sandbox_baseline")
    os.makedirs(pkg)
    names = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", f"{ref}:atgrpo/sandbox"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        with open(os.path.join(pkg, name), "wb") as f:
            f.write(subprocess.run(["git", "-C", repo, "show", f"{ref}:atgrpo/sandbox/{name}"],
                                   capture_output=True, check=True).stdout)
    sys.path.insert(0, tmp)
    return importlib.import_module("atgrpo_sandbox_baseline")


def measure(fn, runs: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), cpu_seconds()
    fn(runs)
    return time.perf_counter() - t0, cpu_seconds() - c0


def compare(args) -> None:
    """Baseline vs this checkout, one at a time and in a pool of 2, in alternating rounds."""
    old = load_baseline(args.baseline)
    impls = [(f"sandbox at {args.baseline}", old), ("sandbox (this checkout)", sandbox)]
    for _, sbx in impls:
        sequential(3, sbx)  # warm up: isolation probe, page cache
    modes = [("one at a time", 1, lambda sbx: lambda n: sequential(n, sbx)),
             ("SandboxPool", 2, lambda sbx: pooled(2, sbx))]
    totals = {(name, mode): [0.0, 0.0, 0] for name, _ in impls for mode, _, _ in modes}
    bare_t = [0.0, 0]
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        t, _ = measure(bare, args.runs)
        bare_t[0] += t
        bare_t[1] += args.runs
        for mode, _, make in modes:
            for name, sbx in impls:
                t, c = measure(make(sbx), args.runs)
                acc = totals[(name, mode)]
                acc[0] += t
                acc[1] += c
                acc[2] += args.runs
    print(f"isolation now: {sandbox.isolation()}\ncpus: {os.cpu_count()}, python {platform.python_version()}, "
          f"kernel {platform.release()}, load average before {[round(x, 2) for x in load_before]}, "
          f"after {[round(x, 2) for x in os.getloadavg()]}; {args.rounds} rounds of {args.runs} runs\n")
    print("| implementation | mode | workers | exec/s | ms/exec (wall) | CPU ms/exec |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| bare subprocess (no sandbox) | one at a time | 1 | {bare_t[1] / bare_t[0]:.1f} "
          f"| {1000 * bare_t[0] / bare_t[1]:.1f} | |")
    rows = []
    for (name, mode), (t, c, n) in totals.items():
        workers = next(w for m, w, _ in modes if m == mode)
        rows.append({"implementation": name, "mode": mode, "workers": workers, "exec_per_s": round(n / t, 1),
                     "ms_per_exec": round(1000 * t / n, 2), "cpu_ms_per_exec": round(1000 * c / n, 2)})
        print(f"| {name} | {mode} | {workers} | {n / t:.1f} | {1000 * t / n:.1f} | {1000 * c / n:.1f} |")
    for mode, _, _ in modes:
        new = next(r for r in rows if r["mode"] == mode and r["implementation"] == impls[1][0])
        base = next(r for r in rows if r["mode"] == mode and r["implementation"] == impls[0][0])
        print(f"{mode}: this checkout / baseline = {new['exec_per_s'] / base['exec_per_s']:.2f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"program": CODE, "cpus": os.cpu_count(), "baseline": args.baseline, "rounds": args.rounds,
                   "bare_exec_per_s": round(bare_t[1] / bare_t[0], 1), "results": rows}, f, indent=2)
    print(f"\nwrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="executions per configuration")
    parser.add_argument("--out", default="bench_out/sandbox.json")
    parser.add_argument("--baseline", help="git revision whose atgrpo/sandbox to measure alongside")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (with --baseline)")
    args = parser.parse_args()
    if args.baseline:
        return compare(args)

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
