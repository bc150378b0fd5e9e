"""Are two runs the same? Compares the metrics.jsonl of two run directories row by row, timings aside
(``time/*``, ``perf/*``), and prints the first differences. Exit status 0: identical; 1: they differ.

    python benchmarks/compare_runs.py RUN_A RUN_B            # two run directories
    python benchmarks/compare_runs.py --tree TREE_A TREE_B   # every run directory under TREE_A against TREE_B's

What it is for: a change meant to keep behaviour (a refactor) shows it by running the same configs at the same
seed before and after and comparing (docs/reliability.md, "Determinism": same seed, config, machine and thread
count give identical rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

TIMINGS = ("time/", "perf/")


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMINGS)} for line in f]


def differences(a: str, b: str, limit: int = 10) -> list[str]:
    """Where the rows of run ``a`` and run ``b`` differ (at most ``limit`` lines); empty when identical."""
    ra, rb = rows(a), rows(b)
    out = [] if len(ra) == len(rb) else [f"{len(ra)} rows against {len(rb)}"]
    for x, y in zip(ra, rb):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                out.append(f"step {x.get('step')}: {k}: {x.get(k)!r} != {y.get(k)!r}")
    return out[:limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tree", action="store_true", help="compare every run directory under A with the same under B")
    args = p.parse_args(argv)
    pairs = [(args.a, args.b)]
    if args.tree:
        names = sorted(n for n in os.listdir(args.a) if os.path.exists(os.path.join(args.a, n, "metrics.jsonl")))
        pairs = [(os.path.join(args.a, n), os.path.join(args.b, n)) for n in names]
    same = True
    for a, b in pairs:
        if not os.path.exists(os.path.join(b, "metrics.jsonl")):
            print(f"{a}: no run at {b}")
            same = False
            continue
        diff = differences(a, b)
        print(f"{a} vs {b}: {len(rows(a))} rows, " + ("identical (timings aside)" if not diff else "DIFFERENT"))
        for line in diff:
            print("  " + line)
        same = same and not diff
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
