"""A training run in progress (``Run``): its state, where its outputs go (metrics rows, dumped rollouts, held-out
transcripts, report.html, checkpoints) and what its steps have produced so far; and the two errors that stop a
run from inside it (too many non-finite updates, a checkpoint that cannot be written). The loop that drives it
is ``run.py``."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import Config
from .atomic_files import atomic_write_text
from .checkpoint import latest_checkpoint, save_checkpoint
from .metrics import MetricsLogger, rss_mb, step_line
from .recovery import Recovery
from .run_dir import RunError, one_line, warn
from .state import TrainState


class NonFiniteError(RunError):
    """Too many updates were skipped for a non-finite loss or gradient (``train.max_nonfinite``)."""


class CheckpointWriteError(Exception):
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
        try:
            path = save_checkpoint(self.run_dir, self.state, {
                "rows": self.rows, "evals": self.evals, "eval_before": self.before, "warmstart_done": True,
                "warmstart": self.summary.get("warmstart"), "nonfinite": self.nonfinite},
                self.cfg.train.keep_checkpoints)
        except Exception as e:  # written into a .tmp-* directory, removed again: older checkpoints are untouched
            why = io_error(e)
            if why is None:
                raise
            last = latest_checkpoint(self.run_dir)
            raise CheckpointWriteError(
                f"could not write the checkpoint of step {self.state.step} in {self.run_dir} "
                f"({why}); " + (f"the previous checkpoint {last.path} is intact: make room, "
                f"then continue with: atgrpo train --resume {self.run_dir}" if last else
                "no earlier checkpoint: make room and start the run again")) from e
        self.saved, self.saved_at = self.state.step, time.time()
        return path

    def log(self, step: int, metrics: dict[str, Any], samples: list) -> None:
        """One metrics row (metrics.jsonl, the loggers, the console), and the step's rollouts if it is dumped."""
        metrics["perf/rss_mb"] = rss_mb()
        self.logger.log(step, metrics)
        self.rows.append({"step": step, **metrics})
        self.say(step_line(self.rows[-1]))
        if step in (set(self.cfg.train.dump_rollouts) or {1, self.cfg.train.steps}):
            with open(os.path.join(self.run_dir, "rollouts", f"step_{step}.jsonl"), "w") as f:
                for s in samples:
                    f.write(json.dumps(s.dump()) + "\n")

    def evaluated(self, step: int, episodes: list) -> None:
        """After a held-out evaluation: its episodes to eval_transcripts.jsonl (the latest evaluation's; the one
        before RL also to eval_transcripts_start.jsonl, kept), and report.html refreshed, so that a run in progress
        can be looked at."""
        text = "".join(json.dumps({"problem": e.problem, "success": e.success, "step": step,
                                   "transcript": e.transcript}) + "\n" for e in episodes)
        for name in ["eval_transcripts.jsonl"] + (["eval_transcripts_start.jsonl"] if step == 0 else []):
            atomic_write_text(os.path.join(self.run_dir, name), text)
        self.refresh_report()

    def refresh_report(self) -> None:
        """Write report.html; a failure is a warning, never the end of the run."""
        from ..report import write_report

        try:
            write_report(self.run_dir)
        except Exception as e:  # the report reads files a user may have touched: warn, and train on
            warn(f"atgrpo: warning: {self.run_dir}/report.html not written: {type(e).__name__}: {one_line(e)}")

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


def io_error(e: BaseException) -> str | None:
    """What an I/O failure was (``No space left on device``), for an ``OSError`` or a library's error that wraps
    one (safetensors: "I/O error: ... (os error 28)"); None for anything else (a bug: raised as it is)."""
    if isinstance(e, OSError):
        return e.strerror or one_line(e)
    m = re.search(r"\(os error (\d+)\)", str(e))
    return os.strerror(int(m.group(1))) if m else None
