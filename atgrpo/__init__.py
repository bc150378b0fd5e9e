"""atgrpo: AT-GRPO for multi-agent LLM teams.

From Python: ``atgrpo.train(config, overrides=[...])`` runs a training as ``atgrpo train`` does and returns its
summary; ``atgrpo.runs.load(run_dir)`` reads a run directory (metrics, trees, transcripts, config, summary).
"""

from typing import Any, Sequence

from . import runs

__version__ = "0.1.0"
__all__ = ["runs", "train"]


def train(config: str | None = None, overrides: Sequence[str] = (), out: str | None = None,
          resume: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Train from a config file and overrides; the summary (see ``atgrpo.api.train``). torch is imported here,
    not by ``import atgrpo``."""
    from .api import train as train_run

    return train_run(config, overrides, out=out, resume=resume, progress=progress)
