"""Running the real-model table's cells, one after the other or ``jobs`` at a time (each in a process of its own),
each result saved as soon as its cell finishes.

A cell's result is ``<out>/cells/<task>/<row>/seed<k>.json`` (written atomically); a cell whose file exists is
skipped, so the table can be filled over several invocations, unless its config file changed since (the file
records the config's digest): such a cell is *stale*, left out of the table and run again from scratch. A cell's
run directory is ``<runs>/<task>/<row>/seed<k>/``: a cell stopped part-way (Ctrl-C, a crash) resumes from its last
checkpoint the next time. After a cell's file is written its run's ``checkpoint/`` is removed (the weights are
0.5 GB per model) unless ``keep_checkpoints``; metrics, transcripts and summary stay. Beside the result file,
``seed<k>.md`` holds a solved and a failed held-out episode before and after RL (``real_transcripts``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from typing import Any, Callable

from ..trainer.memory import peak_rss_gb, reset_peak_rss
from .real_estimate import estimate
from .real_table import Cell, config_path
from .real_transcripts import write_cell_transcripts


def cell_file(out: str, cell: Cell) -> str:
    return os.path.join(out, "cells", cell.task, cell.row, f"seed{cell.seed}.json")


def run_dir(runs: str, cell: Cell) -> str:
    return os.path.join(runs, cell.task, cell.row, f"seed{cell.seed}")


def finished_cells(out: str) -> list[dict[str, Any]]:
    """Every cell file under ``<out>/cells``, in path order."""
    found = []
    root = os.path.join(out, "cells")
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".json"):
                with open(os.path.join(dirpath, name)) as f:
                    found.append(json.load(f))
    return found


def config_digest(task: str, row: str, root: str = ".") -> str:
    """The digest of an RL row's config (its content, not its comments, nor the keys that only say how the work
    is split and saved: ``run_dir.EXECUTION_ONLY``): a cell's result holds for the config it ran with."""
    import yaml

    from ..trainer.metrics import flatten
    from ..trainer.run_dir import EXECUTION_ONLY

    with open(config_path(task, row, root)) as f:
        flat = flatten(yaml.safe_load(f) or {})
    content = json.dumps({k: v for k, v in flat.items() if k not in EXECUTION_ONLY}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def is_current(result: dict[str, Any], root: str = ".") -> bool:
    """Whether a cell's result was run with its config file as it is now."""
    return result.get("config_sha") == config_digest(result["task"], result["row"], root)


def current_cells(out: str, root: str = ".") -> tuple[list[dict[str, Any]], list[str]]:
    """The finished cells run with today's configs, and the names of the stale ones (config changed since)."""
    current, stale = [], []
    for r in finished_cells(out):
        if is_current(r, root):
            current.append(r)
        else:
            stale.append(f"{r['task']}/{r['row']}/seed{r['seed']}")
    return current, stale


def cell_config(cell: Cell, extra: list[str], root: str = "."):
    """The loaded config of a cell: its file, its seed, then ``extra`` overrides (tests: a tiny model)."""
    from ..config import load_config

    return load_config(config_path(cell.task, cell.row, root), [f"seed={cell.seed}", *extra])


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``unknown`` where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def run_precision(directory: str) -> str:
    """``model.precision`` of the run's resolved config.yaml where the config has that key, else float32."""
    import yaml

    with open(os.path.join(directory, "config.yaml")) as f:
        model = (yaml.safe_load(f) or {}).get("model", {})
    return str(model.get("precision", "float32"))


def evals_of(directory: str, summary: dict[str, Any]) -> tuple[list[list[float]], int]:
    """The held-out success after each evaluation as ``[step, success]`` (step 0: before RL; the last: after
    RL, which metrics.jsonl logs as its own row), and the responses sampled over the run."""
    evals, samples = [[0, summary["eval_before"]["success_rate"]]], 0
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            samples += row.get("rollout/samples", 0)
            if "eval/success_rate" in row:
                evals.append([row["step"], row["eval/success_rate"]])
    return evals, int(samples)


def rollout_curve(directory: str) -> list[list[float]]:
    """The tree rollouts' success at each step as ``[step, success]`` (the learning curve between the held-out
    evaluations)."""
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [[r["step"], r["rollout/success_rate"]] for r in rows if "rollout/success_rate" in r]


WALL_FILE = "cell_wall.json"  # in a run directory: seconds spent in earlier, interrupted attempts at the cell


def earlier_seconds(directory: str) -> float:
    """Seconds spent on the cell by earlier attempts that stopped part-way (0 for a fresh cell): what the attempts
    that saw their end (a signal, an exception) recorded in ``WALL_FILE``, plus, when the last attempt was killed
    without a word (SIGKILL, the kernel's out-of-memory killer), the time from its start (``config.yaml``, which
    every start rewrites) to its newest checkpoint: the work it kept, which the next attempt does not redo. A run
    that finished (``summary.json`` newer than ``config.yaml``; e.g. one trained by ``atgrpo train`` under the
    cell's config and then handed to the bench) counts its last attempt's own ``wall_seconds``, evaluations
    included."""
    from ..trainer.atomic_files import MANIFEST_FILE
    from ..trainer.checkpoint import latest_checkpoint

    def mtime(path: str) -> float | None:
        try:
            return os.path.getmtime(path)
        except OSError:
            return None

    def seconds(path: str, key: str) -> float | None:
        try:
            with open(path) as f:
                return float(json.load(f)[key])
        except (OSError, ValueError, KeyError):
            return None

    wall_file, summary_file = os.path.join(directory, WALL_FILE), os.path.join(directory, "summary.json")
    recorded = seconds(wall_file, "seconds") or 0.0
    started, ckpt = mtime(os.path.join(directory, "config.yaml")), latest_checkpoint(directory)
    finished = mtime(summary_file)
    if started is not None and finished is not None and finished > started:  # the last attempt saw its end
        last = seconds(summary_file, "wall_seconds")
        if last is not None:
            return recorded + last
    kept = mtime(os.path.join(ckpt.path, MANIFEST_FILE)) if ckpt else None
    if started is not None and kept is not None and (mtime(wall_file) or 0.0) < started < kept:
        recorded += kept - started  # the last attempt left no record: killed
    return recorded


def retire_stale_run(directory: str, cfg) -> str | None:
    """Move a cell's run directory aside (``<dir>.stale-<time>``) when resuming it would mix two recipes: the run
    in it (finished, with a stale result, or stopped part-way) was started under another config than ``cfg``,
    other than in the keys the trainer resolves from the machine. Returns the reason, or None when the directory
    is absent or may be resumed. A stale result file does not decide: a partial run started after the config
    changed is the current recipe's and resumes."""
    from ..trainer.run_dir import config_changes, key_list

    if not os.path.isdir(directory):
        return None
    changed = config_changes(directory, cfg)
    if not changed:
        return None
    os.rename(directory, f"{directory}.stale-{time.strftime('%Y%m%d%H%M%S')}")
    return f"its run has another config ({key_list(changed, most=4)})"


def run_cell(cell: Cell, out: str, runs: str, extra: list[str], root: str = ".", progress: bool = False,
             keep_checkpoints: bool = False) -> dict[str, Any]:
    """Train one cell (resuming its run directory when one is there under the same config: ``retire_stale_run``)
    and write its result file at once. Its wall time includes earlier attempts that stopped part-way
    (``WALL_FILE``)."""
    from ..trainer.atomic_files import atomic_write_text
    from ..trainer.run import train

    cfg = cell_config(cell, extra, root)
    directory = run_dir(runs, cell)
    reason = retire_stale_run(directory, cfg)
    if reason:
        print(f"{cell.name}: starting afresh, {reason}; the old run directory is kept as {directory}.stale-*",
              flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start, before = time.time(), earlier_seconds(directory)
    reset_peak_rss()
    try:
        summary = train(cfg, directory, progress=progress, resume=os.path.isdir(directory))
    except BaseException:  # stopped part-way (a signal, a crash): keep the time spent for the resumed cell's total
        if os.path.isdir(directory):
            atomic_write_text(os.path.join(directory, WALL_FILE),
                              json.dumps({"seconds": before + time.time() - start}) + "\n")
        raise
    wall = before + time.time() - start
    evals, samples = evals_of(directory, summary)
    result = {"task": cell.task, "row": cell.row, "seed": cell.seed,
              "config": os.path.relpath(config_path(cell.task, cell.row, root), root),
              "config_sha": config_digest(cell.task, cell.row, root), "extra_overrides": extra,
              "eval_problems": cfg.eval.problems, "evals": evals, "rollout_success": rollout_curve(directory),
              "start": evals[0][1],
              "end": summary["eval_after"]["success_rate"],
              "steps": summary["steps"], "samples": samples, "precision": run_precision(directory),
              "cpu": cpu_model(), "threads": cfg.train.threads, "loadavg_1m_at_start": load,
              "peak_rss_gb": peak_rss_gb(), "wall_seconds": wall,
              "warmstart_seconds": (summary.get("warmstart") or {}).get("seconds"),
              "resumed_from_step": summary.get("resumed_from_step"),
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = cell_file(out, cell)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
    write_cell_transcripts(directory, path[:-len(".json")] + ".md", f"{cell.name}: held-out examples")
    if not keep_checkpoints:
        shutil.rmtree(os.path.join(directory, "checkpoint"), ignore_errors=True)
    return result


def plan(cells: list[Cell], out: str, extra: list[str], root: str = ".") -> list[dict[str, Any]]:
    """Each selected cell with its state (``done`` when its file exists and its config is unchanged, ``stale``
    when the config changed since) and estimated seconds (measured or the cost model;
    ``atgrpo/bench/real_estimate.py``)."""
    finished, stale = current_cells(out, root)
    earlier = [r for r in finished_cells(out) if not is_current(r, root)]
    rows = []
    for cell in cells:
        seconds, source = estimate(cell.task, cell.row, cell_config(cell, extra, root), finished, earlier)
        rows.append({"cell": cell, "done": os.path.exists(cell_file(out, cell)) and cell.name not in stale,
                     "stale": cell.name in stale, "seconds": seconds, "source": source})
    return rows


BUDGET_S = 30 * 60  # the table's per-cell budget on 2 cores


def plan_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The plan as text: one line per cell (a cell estimated over the 30-minute budget is marked), then the
    totals."""
    lines = []
    for r in rows:
        state = "done" if r["done"] else "stale" if r.get("stale") else "todo"
        over = "  OVER the 30 min budget" if r["seconds"] > BUDGET_S else ""
        lines.append(f"{r['cell'].name:28s} {state}  ~{r['seconds'] / 60:5.1f} min ({r['source']}){over}")
    todo = [r for r in rows if not r["done"]]
    lines.append(f"{len(rows)} cells, {len(rows) - len(todo)} done, {len(todo)} to run: "
                 f"~{sum(r['seconds'] for r in todo) / 3600:.1f} h estimated")
    return lines


def run_plan(rows: list[dict[str, Any]], out: str, runs: str, extra: list[str], root: str = ".",
             say: Callable[[str], None] = print, progress: bool = False, keep_checkpoints: bool = False,
             jobs: int = 1) -> list[dict[str, Any]]:
    """Run the plan's cells that are not done, with a progress line after each (done/total, elapsed, estimated time
    left) and the table rewritten from the cell files, so a run stopped between cells leaves it up to date. A cell
    that raises is reported and the others go on; returns the failures.

    ``jobs`` > 1: that many cells side by side, each in a fresh process (each cell's own ``train.threads``, 1 in
    the table's configs, so two cells use the two cores one cell leaves half idle; a cell of SmolLM2 peaks under
    4 GiB). Progress bars are off then; cells report as they finish."""
    from .real_report import write_report

    todo = [r for r in rows if not r["done"]]
    failed, start = [], time.time()

    def finished(i: int, r: dict[str, Any], run: Callable[[], dict[str, Any]]) -> None:
        cell = r["cell"]
        try:
            result = run()
            what = f"{result['start']:.3f} -> {result['end']:.3f} in {result['wall_seconds'] / 60:.1f} min"
            write_report(*current_cells(out, root), out)
        except Exception as e:  # one failed cell must not stop the others; it stays todo for the next run
            failed.append({"cell": cell.name, "error": f"{type(e).__name__}: {e}"})
            what = f"FAILED: {failed[-1]['error']}"
        left = sum(x["seconds"] for x in todo[i:]) / max(1, jobs)
        say(f"[{i}/{len(todo)}] {cell.name}: {what}; elapsed {(time.time() - start) / 60:.1f} min, "
            f"~{left / 60:.1f} min left")

    if jobs <= 1 or len(todo) <= 1:
        for i, r in enumerate(todo, 1):
            say(f"[{i}/{len(todo)}] {r['cell'].name}: starting (~{r['seconds'] / 60:.1f} min)")
            finished(i, r, lambda: run_cell(r["cell"], out, runs, extra, root, progress, keep_checkpoints))
        return failed

    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    say(f"{len(todo)} cells, {jobs} at a time")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(run_cell, r["cell"], out, runs, extra, root, False, keep_checkpoints): r for r in todo}
        for i, future in enumerate(as_completed(futures), 1):
            finished(i, futures[future], future.result)
    return failed
