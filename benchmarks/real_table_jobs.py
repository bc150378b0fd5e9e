"""What ``atgrpo bench real-table --jobs 2`` does to the table's wall time, on two shortened cells: the Plan-Path
team cell (L1) with seeds 0 and 1, each cut to one step (4 warm-start episodes, 4 problems, 2 held-out problems,
no checkpoints), run one after the other and then side by side, each into a fresh directory.

    python benchmarks/real_table_jobs.py [OUT_DIR]     # default: a temporary directory

Prints JSON per way (``jobs`` 1 and 2): the whole call's seconds and each cell's wall seconds, peak resident
memory (GiB) and warm-start seconds. About 11 minutes on 2 cores.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

SHORT = ["warmstart.episodes=4", "train.steps=1", "eval.problems=2", "rollout.problems_per_step=4",
         "train.checkpoint_every=0"]


def main(base: str) -> dict:
    from atgrpo.bench.real_cells import finished_cells
    from atgrpo.bench.real_command import run_real_table

    result = {}
    for jobs in (1, 2):
        out, runs = f"{base}/jobs{jobs}/out", f"{base}/jobs{jobs}/runs"
        t = time.time()
        failed = run_real_table(out, runs, ["plan_path"], ["mas_L1"], [0, 1], extra=SHORT, jobs=jobs)["failed"]
        result[jobs] = {"seconds": round(time.time() - t, 1), "failed": failed,
                        "cells": [{k: c[k] for k in ("seed", "wall_seconds", "peak_rss_gb", "warmstart_seconds")}
                                  for c in finished_cells(out)]}
        print(json.dumps({"jobs": jobs, **result[jobs]}), flush=True)
    return result


if __name__ == "__main__":  # (a must: --jobs starts its cells' processes by spawning, which imports this file)
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="real_table_jobs_"))
