"""Start a run from Python, as the ``atgrpo train`` command does (the same config files and overrides)::

    import atgrpo
    summary = atgrpo.train("configs/quickstart.yaml", overrides=["train.steps=2"], out="runs/try")
    summary["eval_after"]["success_rate"]
    run = atgrpo.runs.load("runs/try")   # its metrics, trees and transcripts

Errors are the command's: ``ConfigError`` for a bad key or value (before any work), ``RunError`` for an unusable
run directory, ``NonFiniteError`` / ``TrainingInterrupted`` for a run that stopped.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Sequence

from .config import Config, load_config, load_resume_config

__all__ = ["default_run_dir", "train"]


def default_run_dir(cfg: Config) -> str:
    """``runs/<time>-<env>-<sharing>``: where a run goes when no directory is given."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name.rpartition(":")[2] or cfg.env.name)  # module:Class
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S") + f"-{env}-{cfg.policy.sharing}")


def train(config: str | None = None, overrides: Sequence[str] = (), out: str | None = None,
          resume: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Train with the config file ``config`` (None: the built-in quickstart) and dotted ``key=value``
    ``overrides``, into the run directory ``out`` (default ``default_run_dir``); ``resume``: continue the run in
    that directory instead (only ``train.steps=N`` may be overridden). Returns the summary (summary.json), with
    ``run_dir`` set; the directory also holds report.html."""
    from .trainer.run import train as run_training

    if resume is not None:
        if config is not None:
            raise ValueError("resume continues with the run's own config; give no config file")
        cfg, out = load_resume_config(resume, list(overrides)), resume
    else:
        cfg = load_config(config, list(overrides))
        out = out or default_run_dir(cfg)
    return run_training(cfg, out, progress=progress, resume=resume is not None)
