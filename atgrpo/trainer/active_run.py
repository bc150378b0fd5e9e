"""A training run in progress (``Run``): its state, where its outputs go (metrics rows, dumped rollouts, held-out
transcripts, report.html, checkpoints) and what its steps have produced so far; and the two errors that stop a
run from inside it (too many non-finite updates, a checkpoint that cannot be written). The loop that drives it
is ``run.py``.

A file of the run that cannot be written stops the run with one line (``write_faults.RunWriteError``, exit 2),
logs included: a run that went on past a lost metrics row or rollout dump would end with it missing (the rollouts
are in no checkpoint; a metrics row is written again only by a later resume), while one that stops now loses
nothing (the resume redoes the steps since the last checkpoint and writes them). Only report.html, a view made
again by ``atgrpo report``, is a warning.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import Config
from .atomic_files import atomic_write_text
from .checkpoint import CHECKPOINT_DIR, STAGE_FILES, latest_checkpoint, save_checkpoint
from .failpoints import failpoint
from .metrics import MetricsLogger, rss_mb, step_line
from .recovery import Recovery
from .run_dir import RunError, one_line, warn
from .state import TrainState
from .write_faults import RunWriteError, io_fault, remedy, stop_on_write_error, warn_on_write_error

LOG_WHY = (" (going on would leave the run's logs without this step's lines for good; the resume redoes the steps "
           "since the checkpoint and writes them)")


class NonFiniteError(RunError):
    """Too many updates were skipped for a non-finite loss or gradient (``train.max_nonfinite``)."""


class CheckpointWriteError(RunWriteError):
    """A checkpoint could not be written (a full disk, no permission); the previous one is intact."""


@dataclass
class Run:
    """A training run in progress: its state, where its outputs go, and everything its steps have produced so
    far (what a checkpoint holds besides the weights)."""

    cfg: Config
    run_dir: str
    state: TrainState
    logger: MetricsLogger
    summary: dict[str, Any]
    before: dict[str, float]  # held-out metrics before training
    rows: list[dict[str, Any]] = field(default_factory=list)  # the metrics rows, one per step
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success rate)
    nonfinite: int = 0  # updates skipped for a non-finite loss or gradient, all steps
    saved: int | None = None  # the step of the newest checkpoint on disk
    say: Callable[..., None] = print
    saved_at: float = field(default_factory=time.time)  # when that checkpoint was written (or the run resumed)
    recoveries: list[Recovery] = field(default_factory=list)  # Ray: lost workers recovered from, this process
    failures: int = 0  # Ray: recoveries started (one whose rebuild lost a worker too counts), this process
    lost_s: float = 0.0  # seconds lost to recoveries since the last metrics row
    before_episodes: list | None = None  # the first evaluation's episodes (fresh run): the last one if no step runs

    def checkpoint(self) -> str:
        self.state.backend.pull_state(self.state)  # Ray: the optimizer states live on the update workers
        step, stage = self.state.step, ["policies"]

        def at(s: str) -> None:
            stage[0] = s
            failpoint(f"checkpoint.{s}", step)
        final = os.path.join(self.run_dir, CHECKPOINT_DIR, f"step_{step}")
        try:
            path = save_checkpoint(self.run_dir, self.state, {
                "rows": self.rows, "evals": self.evals, "eval_before": self.before, "warmstart_done": True,
                "warmstart": self.summary.get("warmstart"), "nonfinite": self.nonfinite},
                self.cfg.train.keep_checkpoints, at)
        except Exception as e:  # written into a .tmp-* directory, removed again: older checkpoints are untouched
            fault = io_fault(e, final)
            if fault is None:
                raise
            last = latest_checkpoint(self.run_dir)
            raise CheckpointWriteError(
                f"could not write the checkpoint {final} ({STAGE_FILES[stage[0]]}: {fault[1]}); "
                + (f"the checkpoint {last.path} is intact: {remedy(fault[0], final)}, then continue with: "
                   f"atgrpo train --resume {self.run_dir}" if last else
                   f"there is no earlier checkpoint: {remedy(fault[0], final)}, then continue with: atgrpo train "
                   f"--resume {self.run_dir} (it starts the run over)")) from e
        self.saved, self.saved_at = self.state.step, time.time()
        return path

    def writing(self, path: str, why: str = "", where: str | None = None) -> Any:
        """A block that writes ``path``: a write fault stops the run with one line (``stop_on_write_error``)."""
        step = self.state.step
        where = where or (f"at step {step}" if step else "before its first step")
        return stop_on_write_error(path, self.run_dir, where, why)

    def log_row(self, step: int, metrics: dict[str, Any]) -> None:
        """One metrics row: metrics.jsonl, then the logging backends (TensorBoard, wandb, mlflow)."""
        with self.writing(self.logger.path, LOG_WHY):
            self.logger.append(step, metrics)
        with self.writing(os.path.join(self.run_dir, "tensorboard"), LOG_WHY):
            self.logger.to_backends(step, metrics)

    def log(self, step: int, metrics: dict[str, Any], samples: list) -> None:
        """One metrics row (metrics.jsonl, the loggers, the console), and the step's rollouts if it is dumped."""
        metrics["perf/rss_mb"] = rss_mb()
        self.log_row(step, metrics)
        self.rows.append({"step": step, **metrics})
        self.say(step_line(self.rows[-1]))
        failpoint("step.logged", step)
        if step in (set(self.cfg.train.dump_rollouts) or {1, self.cfg.train.steps}):
            path = os.path.join(self.run_dir, "rollouts", f"step_{step}.jsonl")
            with self.writing(path, LOG_WHY):
                atomic_write_text(path, "".join(json.dumps(s.dump()) + "\n" for s in samples))
            failpoint("step.rollouts", step)

    def evaluated(self, step: int, episodes: list) -> None:
        """After a held-out evaluation: its episodes to eval_transcripts.jsonl (the latest evaluation's; the one
        before RL also to eval_transcripts_start.jsonl, kept), and report.html refreshed, so that a run in progress
        can be looked at."""
        self.write_transcripts(step, episodes)
        refresh_report(self.run_dir)

    def write_transcripts(self, step: int, episodes: list, where: str | None = None) -> None:
        text = "".join(json.dumps({"problem": e.problem, "success": e.success, "step": step,
                                   "transcript": e.transcript}) + "\n" for e in episodes)
        for name in ["eval_transcripts.jsonl"] + (["eval_transcripts_start.jsonl"] if step == 0 else []):
            path = os.path.join(self.run_dir, name)
            with self.writing(path, where=where):
                atomic_write_text(path, text)

    def count_nonfinite(self, step: int, skipped: int) -> None:
        """Add a step's skipped updates; warn, and stop the run past ``train.max_nonfinite``."""
        self.nonfinite += skipped
        if skipped:
            warn(f"atgrpo: warning: step {step}: {skipped} update(s) skipped for a non-finite loss or gradient "
                 f"({self.nonfinite} so far; the run stops at train.max_nonfinite={self.cfg.train.max_nonfinite})")
        if self.nonfinite >= self.cfg.train.max_nonfinite:
            last = latest_checkpoint(self.run_dir)
            raise NonFiniteError(
                f"stopped at step {step}: {self.nonfinite} updates were skipped for a non-finite loss or gradient "
                f"(train.max_nonfinite={self.cfg.train.max_nonfinite}); last good checkpoint: "
                f"{last.path if last else 'none'}. Lower algo.lr, use model.dtype=float32, or raise "
                f"train.max_nonfinite")


def refresh_report(run_dir: str) -> None:
    """Write ``run_dir``/report.html; a failure is a warning, never the end of the run."""
    from ..report import REPORT_FILE, write_report

    path = os.path.join(run_dir, REPORT_FILE)
    try:
        with warn_on_write_error(path, f"it is a view of the run's files; `atgrpo report {run_dir}` writes it again"):
            write_report(run_dir)
    except Exception as e:  # the report reads files a user may have touched: warn, and train on
        warn(f"atgrpo: warning: {path} not written: {type(e).__name__}: {one_line(e)}")
