"""atgrpo: AT-GRPO for multi-agent LLM teams.

From Python: ``atgrpo.train(config, overrides=[...])`` runs a training as ``atgrpo train`` does and returns its
summary; ``atgrpo.runs.load(run_dir)`` reads a run directory (metrics, trees, transcripts, config, summary).
"""

import os
import sys
from typing import Any, Sequence

if "torch" not in sys.modules:
    # torch's CPU allocator reads this once, at its first allocation: blocks of 2 MiB and more are then aligned
    # to and advised as transparent huge pages (``trainer/memory.py`` says what that saves); set it to 0 to opt out
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from . import runs

__version__ = "0.1.0"
__all__ = ["runs", "train"]


def train(config: str | None = None, overrides: Sequence[str] = (), out: str | None = None,
          resume: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Train from a config file and overrides; the summary (see ``atgrpo.api.train``). torch is imported here,
    not by ``import atgrpo``."""
    from .api import train as train_run

    return train_run(config, overrides, out=out, resume=resume, progress=progress)
