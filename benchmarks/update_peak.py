"""The update alone on one fixed rollout: seconds and peak resident memory, repeated.

    [SUB=16] [REPS=2] python benchmarks/update_peak.py [CONFIG.yaml] [dotted.key=value ...]

Builds the run's state as ``atgrpo train`` does, without the warm start (default: the Plan-Path table cell, 4
problems, 2 threads), samples one step's rollout (deterministic for a seed and a commit), keeps its first ``SUB``
samples, then runs the backend's update on them ``REPS`` times, each from the same weights and a fresh optimizer
state, and prints each repetition's seconds and its phase peak (``trainer/memory.py``), then the median. Run it
from two ``git worktree`` checkouts one after the other (``PYTHONPATH=<worktree>``) to compare commits on the same
samples; the samples' token counts are printed, so that equal rollouts can be checked.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time


def main(argv: list[str]) -> list[tuple[float, float]]:
    import atgrpo  # noqa: F401  (first: it sets torch's allocator up before torch allocates)
    import torch

    from atgrpo.cli import _split_args
    from atgrpo.config import load_config
    from atgrpo.trainer.memory import phase, release_free_memory
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked
    from atgrpo.trainer.step import assign_advantages, rollout

    path, overrides = _split_args(argv)
    path = path or "configs/real/table/plan_path_mas_L1.yaml"
    cfg = set_precision(load_config(path, ["rollout.problems_per_step=4", "train.threads=2", *overrides,
                                           "warmstart.enabled=false"]), lambda *a: None)
    torch.set_num_threads(max(1, cfg.train.threads))
    state = build_state_checked(cfg)
    samples, _ = rollout(state, 1)
    assign_advantages(samples, cfg.algo, cfg.rollout.K)
    samples = samples[:int(os.environ.get("SUB", len(samples)))]
    print(f"{path}: {len(samples)} samples, {sum(len(s.response_ids) for s in samples)} response and "
          f"{sum(len(s.prompt_ids) for s in samples)} prompt tokens", flush=True)
    pid = samples[0].policy
    policy, optimizer = state.policies[pid], state.optimizers[pid]
    weights = copy.deepcopy(policy.model.state_dict())
    out = []
    for rep in range(int(os.environ.get("REPS", 2))):
        policy.model.load_state_dict(weights)
        optimizer.state.clear()
        release_free_memory()
        peaks: dict[str, float] = {}
        t = time.perf_counter()
        with phase("update", peaks):
            state.backend.update(state, {pid: [copy.copy(s) for s in samples if s.policy == pid]})
        out.append((time.perf_counter() - t, peaks.get("update", float("nan")) / 1024))
        print(f"  repetition {rep}: {out[-1][0]:.2f} s, peak {out[-1][1]:.2f} GiB", flush=True)
    print(f"median {statistics.median(s for s, _ in out):.2f} s, highest peak {max(g for _, g in out):.2f} GiB")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
