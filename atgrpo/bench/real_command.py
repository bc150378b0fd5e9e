"""``atgrpo bench real-table``: plan, run and report the real-model table (docs/results.md, "The real-model table").

    atgrpo bench real-table --dry-run                      # the plan: every cell, done or not, estimated time
    atgrpo bench real-table --tasks math --rows mas_L1 --seeds 0
    atgrpo bench real-table --report-only                  # table.json / table.md from the cell files only
    atgrpo bench real-table --tasks plan_path --jobs 2     # two cells side by side (one thread each)

Cells run one after the other, or ``--jobs N`` at a time, each in a process of its own; each finished cell's file
is written at once and a rerun skips it. The table is
rewritten from all cell files after every invocation (and after each cell), so it always shows what is done.
"""

from __future__ import annotations

from typing import Any, Callable

from .real_cells import current_cells, plan, plan_lines, run_plan
from .real_report import write_report
from .real_table import select

DEFAULT_OUT = "docs/results/real"
DEFAULT_RUNS = "runs_real/table"


def parse_list(text: str | None, kind: type = str) -> list[Any] | None:
    """``a,b,c`` -> a list (``None`` stays ``None``: every choice); ``kind=int`` for seeds."""
    if text is None:
        return None
    from ..config import ConfigError

    try:
        return [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected a comma-separated list of {kind.__name__}s, got {text!r}") from None


def run_real_table(out: str = DEFAULT_OUT, runs: str = DEFAULT_RUNS, tasks: list[str] | None = None,
                   rows: list[str] | None = None, seeds: list[int] | None = None, dry_run: bool = False,
                   report_only: bool = False, extra: list[str] | None = None, root: str = ".",
                   say: Callable[[str], None] = print, progress: bool = False,
                   keep_checkpoints: bool = False, jobs: int = 1) -> dict[str, Any]:
    """Select the cells, print the plan, run the cells not done (unless ``dry_run`` or ``report_only``), write
    ``<out>/table.json`` and ``table.md`` (unless ``dry_run``). ``extra``: overrides after each cell's config
    (tests use a tiny model; recorded in each cell file); ``jobs``: cells side by side (``run_plan``). Returns
    {"plan", "failed", "table"}."""
    extra = list(extra or [])
    cells = select(tasks, rows, seeds)
    result: dict[str, Any] = {"plan": [], "failed": [], "table": None}
    if not report_only:
        result["plan"] = plan(cells, out, extra, root)
        for line in plan_lines(result["plan"]):
            say(line)
        if not dry_run:
            result["failed"] = run_plan(result["plan"], out, runs, extra, root, say, progress, keep_checkpoints,
                                        jobs)
    if not dry_run:
        result["table"] = write_report(*current_cells(out, root), out)
        say(f"written: {out}/table.json, {out}/table.md")
    return result
