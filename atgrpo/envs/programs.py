"""Programs written by agents: reading them from model text, and running them in the sandbox (cached).

One module for every task whose agents write code (the code task's coder and tester, the math tool agent, the
tool agent of Plan-Path, Sokoban and Sudoku in ``tool_mode="code"``), so that all of them read programs the
same way and share one cache of results.

Reading (``extract_code``): the last fenced block tagged ``python`` / ``py`` / ``python3``; else the last
untagged fenced block; else an unclosed final fence (a model that ran out of tokens); else the whole text.
Never raises: junk text is a "program" that fails to run.

Running (``run_jobs``): each (code, stdin, timeout) job is one ``atgrpo.sandbox.run_python``; uncached jobs of
a batch run on a shared ``SandboxPool`` (or one by one, ``parallel=False``). Results are cached by
(code, stdin, timeout) in one bounded, process-wide LRU, so identical programs of a tree node (K candidates
that wrote the same code) run once. Timed-out runs are cached only with ``cache_timeouts=True`` (the tool
agents' programs, taken to be deterministic: a candidate that loops forever costs one timeout, not K); the
code task judges a timeout afresh, since it may come from a loaded machine.

``run_program`` is the tool agents' view of one run: the program, its exit status, the last non-empty stdout
line (the answer) and short stdout / stderr tails for the next prompts.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from ..sandbox import ExecResult, Limits, SandboxPool, run_python

MAX_TEXT_CHARS = 20_000  # longer answers are cut before the program is read
TAIL_CHARS = 400  # stdout / stderr kept for prompts
CACHE_SIZE = 8192

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", re.S | re.I)
_PYTHON_FENCE = re.compile(r"```[ \t]*(?:python3?|py)\b[^\n]*\n", re.I)  # the opening of a python block


def extract_code(text: str) -> tuple[str, bool]:
    """(program, found_block): the code of the last python block (see the module docstring)."""
    text = text[:MAX_TEXT_CHARS]
    blocks = _FENCE.findall(text)
    tagged = [body for tag, body in blocks if tag.lower() in ("python", "py", "python3")]
    if tagged:
        return tagged[-1], True
    untagged = [body for tag, body in blocks if not tag]
    if untagged:
        return untagged[-1], True
    unclosed = _OPEN_FENCE.search(text)
    if unclosed and "```" not in unclosed.group(1):
        return unclosed.group(1), True
    return text, False


def has_python_block(text: str) -> bool:
    """Whether ``text`` opens a python code block (```python, ```py or ```python3; closed or left open)."""
    return _PYTHON_FENCE.search(text[:MAX_TEXT_CHARS]) is not None


# ---- running, with one cache ------------------------------------------------------------------------------
Job = tuple[str, str, float]  # (code, stdin, timeout)
_cache: OrderedDict[str, ExecResult] = OrderedDict()
_cache_lock = threading.Lock()
_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def _key(job: Job, packages: tuple[str, ...] = ()) -> str:
    code, stdin, timeout = job
    text = f"{timeout}\0{','.join(packages)}\0{len(code)}\0{code}\0{stdin}"
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def shared_pool() -> SandboxPool:
    """One process-wide pool (threads waiting on sandboxed subprocesses); created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool(max_workers=max(2, os.cpu_count() or 1))
        return _pool


def run_jobs(jobs: Sequence[Job], parallel: bool = True, cache: bool = True, cache_timeouts: bool = False,
             packages: Sequence[str] = ()) -> list[ExecResult]:
    """Run (code, stdin, timeout) jobs in the sandbox; results in the order of ``jobs``. ``packages``: installed
    packages the programs may import (the task's declaration, ``Limits.packages``; none by default)."""
    packages = tuple(packages)
    limits = Limits(packages=packages) if packages else None
    keys = [_key(j, packages) for j in jobs]
    results: dict[str, ExecResult] = {}
    if cache:
        with _cache_lock:
            for k in keys:
                if k in _cache:
                    _cache.move_to_end(k)
                    results[k] = _cache[k]
    todo = {k: j for k, j in zip(keys, jobs) if k not in results}  # also drops duplicates within the batch
    if todo:
        batch = list(todo.values())
        done = (shared_pool().map(batch, limits) if parallel and len(batch) > 1
                else [run_python(*j, limits=limits) for j in batch])
        for k, r in zip(todo, done):
            results[k] = r
        if cache:
            with _cache_lock:
                for k, r in zip(todo, done):
                    if cache_timeouts or not r.timed_out:
                        _cache[k] = r
                while len(_cache) > CACHE_SIZE:
                    _cache.popitem(last=False)
    return [results[k] for k in keys]


# ---- the tool agents' programs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramRun:
    """One run of a tool agent's program, as the environment scores it and the next prompts show it."""

    code: str  # the program read from the answer ('' when there was none)
    exit_code: int | None  # None: not run (no code) or killed by a signal
    timed_out: bool
    stdout: str  # tail
    stderr: str  # tail, sandbox paths removed
    last_line: str | None  # the last non-empty stdout line (stripped), None if nothing was printed

    @property
    def crashed(self) -> bool:
        """No code, a non-zero exit, killed, or timed out."""
        return not self.code.strip() or self.exit_code != 0 or self.timed_out

    @property
    def answer(self) -> str | None:
        """The proposal of a game's tool agent: the last printed line of a run that did not crash."""
        return None if self.crashed else self.last_line

    def status(self, timeout: float) -> str:
        """How the run ended, in words: 'exit code 0', 'timed out after 2 s', 'not run (no code)', ..."""
        if not self.code.strip():
            return "not run (no code)"
        if self.timed_out:
            return f"timed out after {timeout:g} s"
        return f"exit code {self.exit_code}" if self.exit_code is not None else "killed"

    def error(self) -> str:
        """A few characters on why a run failed (compact prompts): 'nocode', 'timeout', 'NameError', ..."""
        if not self.code.strip():
            return "nocode"
        if self.timed_out:
            return "timeout"
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        if lines:
            return lines[-1].split(":")[0][:30]
        return f"exit{self.exit_code}" if self.exit_code is not None else "killed"


def program_output(run: ProgramRun) -> dict[str, str]:
    """The run's stdout and stderr tails for the step's info: the environment's feedback on a candidate, as the
    rollout files and the report show it (the trainer does not read them)."""
    return {"stdout": run.stdout, "stderr": run.stderr}


def run_program(text: str, timeout: float, tail: int = TAIL_CHARS, packages: Sequence[str] = ()) -> ProgramRun:
    """Read the program from ``text`` (``extract_code``) and run it (cached, timeouts included)."""
    code, _ = extract_code(text)
    if not code.strip():
        return ProgramRun("", None, False, "", "", None)
    res = run_jobs([(code, "", timeout)], parallel=False, cache_timeouts=True, packages=packages)[0]
    lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    stderr = re.sub(r'File "[^"]*main\.py"', 'File "main.py"', res.stderr)  # no sandbox paths: reproducible
    return ProgramRun(code, res.exit_code, res.timed_out, res.stdout[-tail:], stderr[-tail:],
                      lines[-1] if lines else None)


def program_info(run: ProgramRun, parsed: bool) -> dict[str, bool]:
    """The step-info flags of a tool program (logged per step as rates per agent): crashed (incl. no code),
    timed out, or ran but printed nothing the environment could read."""
    return {"program_crashed": run.crashed, "program_timed_out": run.timed_out,
            "program_unparsable": not run.crashed and not parsed}
