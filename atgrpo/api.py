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

from .config import Config, ConfigError, load_config, load_resume_config

__all__ = ["default_run_dir", "run_config", "train"]


def default_run_dir(cfg: Config) -> str:
    """``runs/<time>-<env>-<sharing>``: where a run goes when no directory is given."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name.rpartition(":")[2] or cfg.env.name)  # module:Class
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S") + f"-{env}-{cfg.policy.sharing}")


def run_config(config: str | None, overrides: Sequence[str] = (), out: str | None = None,
               resume: str | None = None) -> tuple[Config, str]:
    """The config and the run directory of a training, as ``atgrpo train`` and ``train`` take them: a config file
    (None: the quickstart) with ``overrides`` into ``out`` (default ``default_run_dir``), or ``resume``: the run in
    that directory with its own config.yaml (only ``train.steps=N`` may be overridden). Bad keys and values raise
    ``ConfigError`` here, before any work."""
    if resume is None:
        cfg = load_config(config, list(overrides))
        return cfg, out or default_run_dir(cfg)
    if config is not None:
        raise ConfigError(f"a resumed run continues with its own config ({resume}/config.yaml); give no config "
                          f"file (only train.steps=N, to extend the run)")
    if out and os.path.abspath(out) != os.path.abspath(resume):
        raise ConfigError(f"a resumed run writes into its own directory ({resume}); give no other output directory")
    return load_resume_config(resume, list(overrides)), resume


def train(config: str | None = None, overrides: Sequence[str] = (), out: str | None = None,
          resume: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Train with the config file ``config`` (None: the built-in quickstart) and dotted ``key=value``
    ``overrides``, into the run directory ``out`` (default ``default_run_dir``); ``resume``: continue the run in
    that directory instead (only ``train.steps=N`` may be overridden). Returns the summary (summary.json), with
    ``run_dir`` set; the directory also holds report.html."""
    from .trainer.run import train as run_training

    cfg, out = run_config(config, overrides, out, resume)
    return run_training(cfg, out, progress=progress, resume=resume is not None)
