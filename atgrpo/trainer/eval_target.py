"""What ``atgrpo eval`` evaluates, checked before anything heavy is imported or built: a run directory (its
config.yaml and final policies) or a config file. Imports neither torch nor the model libraries, so a bad
argument is said in a fraction of a second (``evaluate.py`` then builds and loads the policies)."""

from __future__ import annotations

import os

from ..config import Config, ConfigError, load_config
from .run_dir import RunError


def final_dir(target: str) -> str:
    """Where a run directory keeps the policies ``atgrpo eval`` loads."""
    return os.path.join(target, "checkpoint", "final")


def eval_config(target: str, overrides: list[str]) -> Config:
    """The checked config of an ``atgrpo eval`` target (a bad target, key or value, model path, or a run without
    final policies is said at once, not after a warm start); the final policies' checksums are verified when they
    load."""
    if os.path.isdir(target):
        cfg_path = os.path.join(target, "config.yaml")
        if not os.path.exists(cfg_path):
            raise ConfigError(f"{target} is not a run directory (no config.yaml)")
        cfg = load_config(cfg_path, overrides, training=False)
        if not os.path.isdir(final_dir(target)):
            raise RunError(f"the saved policies in {final_dir(target)} are missing (the run has not finished; "
                           f"evaluate its config, or finish it with atgrpo train --resume {target})")
        return cfg
    if os.path.exists(target):
        return load_config(target, overrides, training=False)
    raise ConfigError(f"{target!r} is neither a run directory nor a config file")
