"""The HTML report of one or more runs: ``atgrpo report RUN [RUN ...] [--out FILE]``, and ``RUN/report.html``,
which every run writes at each held-out evaluation and at its end.

One self-contained file (style, script and data inline; no network): an overview (config, held-out success
before and after, summary, curves per step; several runs overlaid with their config differences), a browser of
the sampled trees (step -> problem -> (turn, agent) node -> the K candidates with their rewards, advantages,
the kept one and the environment's feedback) and the held-out transcripts. Built on ``atgrpo.runs``.
"""

from __future__ import annotations

import os
from typing import Callable

from ..runs import load
from ..trainer.atomic_files import atomic_write_text
from .data import MAX_TREE_STEPS, TRANSCRIPT_BUDGET, TREE_BUDGET, report_data
from .page import embedded_data, render

__all__ = ["REPORT_FILE", "embedded_data", "report_data", "write_report"]

REPORT_FILE = "report.html"


def write_report(run_dirs: list[str] | str, out: str | None = None, tree_budget: int = TREE_BUDGET,
                 transcript_budget: int = TRANSCRIPT_BUDGET, max_tree_steps: int = MAX_TREE_STEPS,
                 warn: Callable[[str], None] | None = None) -> str:
    """Write the report of ``run_dirs`` to ``out`` (default: ``RUN/report.html`` for one run, ``report.html``
    here for several) and return its path. Raises ``atgrpo.runs.NotARunError`` for a directory without a run.
    What could not be read (a torn line, a garbled file) is skipped: the page says so, and so does ``warn``
    (one line per run) when given."""
    dirs = [run_dirs] if isinstance(run_dirs, str) else list(run_dirs)
    if not dirs:
        raise ValueError("write_report needs at least one run directory")
    records = [load(d) for d in dirs]
    if out is None:
        out = os.path.join(dirs[0], REPORT_FILE) if len(dirs) == 1 else REPORT_FILE
    data = report_data(records, tree_budget, transcript_budget, max_tree_steps)
    for r in records:  # after report_data: the rollout files it read count too
        note = r.skipped_note()
        if note and warn is not None:
            warn(note)
    title = "atgrpo report: " + ", ".join(r.name for r in records)
    atomic_write_text(out, render(data, title))
    return out
