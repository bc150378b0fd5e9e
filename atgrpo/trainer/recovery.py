"""Recovery without a person (Ray backend, ``system.ray.max_failures``): when a rollout or update worker dies, or
its node leaves (``ray.faults.WorkerLost``), the run rebuilds every pool on what the cluster still has, restores
its newest intact checkpoint (policies, optimizers, every RNG, the metrics rows so far) exactly as
``atgrpo train --resume`` does, and redoes the steps since. Rollouts and updates draw every random number from
the restored state, so the redone steps write the rows an undisturbed run writes (tests/test_ray_recovery.py).
After ``max_failures`` recoveries the next loss stops the run with one line naming the worker, the cause and
the checkpoint to resume from (``RecoveryExhausted``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .checkpoint import latest_checkpoint, restore_newest_intact
from .metrics import MetricsLogger
from .run_dir import warn
from .write_faults import stop_on_write_error

if TYPE_CHECKING:
    from .ray.faults import WorkerLost
    from .active_run import Run


class RecoveryExhausted(Exception):
    """A worker was lost after ``system.ray.max_failures`` recoveries (or with no checkpoint to restore)."""


@dataclass(frozen=True)
class Recovery:
    """One recovery: the step that failed, the checkpoint step it went back to, who died and why, and the
    seconds lost: from the end of that checkpoint until the new workers were up and the state restored (the work
    thrown away, and the restart; the redone steps then take what they took the first time)."""
    failed_step: int
    restored_step: int
    worker: str
    cause: str
    seconds_lost: float


def recover(run: Run, lost: WorkerLost, failed_step: int) -> Recovery:
    """Rebuild the pools, restore the newest intact checkpoint into ``run`` (state, rows, evaluations, the
    metrics file), log the recovery (stderr, ``run.recoveries``); raise ``RecoveryExhausted`` past the limit."""
    limit, last = run.cfg.system.ray.max_failures, latest_checkpoint(run.run_dir)
    resume = (f"resume from {last.path} with: atgrpo train --resume {run.run_dir}" if last else
              "no checkpoint was written; start the run again")
    if run.failures >= limit:
        raise RecoveryExhausted(f"stopped at step {failed_step}: {lost.worker} died ({lost.cause}); "
                                f"{run.failures} recoveries so far, system.ray.max_failures={limit}; {resume}")
    run.failures += 1  # counted before the rebuild: a worker lost while the new ones start is one more loss
    run.state.backend.rebuild()
    found = restore_newest_intact(run.run_dir, run.state, warn=warn)
    if found is None:
        raise RecoveryExhausted(f"stopped at step {failed_step}: {lost.worker} died ({lost.cause}); {resume}")
    ckpt, prog = found
    cfg = run.cfg
    run.rows, run.evals = prog["rows"], [tuple(e) for e in prog["evals"]]
    run.nonfinite, run.saved = int(prog.get("nonfinite", 0)), ckpt.step
    run.logger.close()  # metrics.jsonl (and TensorBoard) back to the checkpoint's rows, as a resume does
    with stop_on_write_error(run.logger.path, run.run_dir, f"while recovering at step {failed_step}"):
        run.logger = MetricsLogger(run.run_dir, cfg.train.tensorboard, rows=prog["rows"], purge_step=ckpt.step + 1,
                                   logging=cfg.logging, params=cfg.to_dict())
    rec = Recovery(failed_step, ckpt.step, lost.worker, lost.cause, time.time() - run.saved_at)
    run.recoveries.append(rec)
    run.lost_s, run.saved_at = run.lost_s + rec.seconds_lost, time.time()  # a next loss counts from here
    warn(f"atgrpo: Ray: recovery {run.failures} of system.ray.max_failures={limit}: {lost.worker} died at "
         f"step {failed_step} ({lost.cause}); pools rebuilt, {ckpt.path} restored, redoing steps "
         f"{ckpt.step + 1}..{failed_step}; {rec.seconds_lost:.1f}s lost")
    return rec
