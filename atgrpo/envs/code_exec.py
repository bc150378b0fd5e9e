"""Pure helpers of the code task: reading test cases from model text and comparing outputs. Programs are read
and run (cached, in parallel) by ``programs``, which the math and game tool agents share.

Parsing never raises: junk text gives empty results that the environment scores as format failures.

Test cases (the unit tester's answer), either
- labelled blocks, one ``Input:`` then one ``Output:`` (or ``Expected output:``) per test, at the start of a
  line, the labels optionally bold (``**Input:**``) and the contents optionally fenced::

      **Input:**
      ```
      3
      1 2 3
      ```
      **Output:**
      ```
      6
      ```
- or a JSON list of objects ``[{"input": "3\\n1 2 3\\n", "output": "6"}, ...]`` (the last such list is used).
At most ``MAX_TESTS`` tests are kept. For function problems (HumanEval) the input is a Python argument list
(``[1, 2], 3``) and the output a Python literal of the return value.

Comparison (``outputs_match``): token by token after splitting on any whitespace (so line breaks and trailing
spaces do not matter); two tokens match when equal as strings or when both are decimal numbers with
``math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)``. In function mode both sides are first read as Python
literals and compared structurally with the same float tolerance (text comparison when that fails).
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Sequence

from ..sandbox import ExecResult
from .programs import MAX_TEXT_CHARS

MAX_TESTS = 5
MAX_FIELD_CHARS = 2_000  # longest test input / output kept
REL_TOL = ABS_TOL = 1e-6

_LABEL = re.compile(r"^[ \t>#*_-]*(?:expected[ \t]+)?(input|output)[ \t]*(?::[ \t]*\**|\**[ \t]*:)[ \t]*", re.I | re.M)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

Test = tuple[str, str]  # (stdin or argument list, expected output)


# ---- reading model text ---------------------------------------------------------------------------------
def syntax_error(code: str) -> str | None:
    """Why ``code`` cannot run (empty, does not compile), as a short '<...>' note, or None. Compiling runs
    nothing; pathological nesting counts as an error."""
    if not code.strip():
        return "<no program>"
    try:
        compile(code, "<program>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"<error: {type(e).__name__}: {e.msg} (line {e.lineno})>"
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return f"<error: {type(e).__name__}: {str(e)[:100]}>"
    return None


def _unfence(s: str) -> str:
    s = s.strip("\n")
    m = re.match(r"\s*```[^\n]*\n(.*?)(?:```|\Z)", s, re.S)
    return (m.group(1) if m else s).strip()


def parse_tests(text: str, function_mode: bool = False) -> tuple[list[Test], dict[str, Any]]:
    """Test cases from the tester's text: (tests, info). Inputs of stdin programs get a final newline."""
    text = text[:MAX_TEXT_CHARS]
    info: dict[str, Any] = {"test_format": None, "tests_truncated": False}
    tests = _json_tests(text)
    if tests is not None:
        info["test_format"] = "json"
    else:
        tests = _labelled_tests(text)
        info["test_format"] = "labels" if tests else None
    if len(tests) > MAX_TESTS:
        tests, info["tests_truncated"] = tests[:MAX_TESTS], True
    out = []
    for inp, exp in tests:
        inp, exp = inp[:MAX_FIELD_CHARS].strip(), exp[:MAX_FIELD_CHARS].strip()
        out.append((inp if function_mode or not inp else inp + "\n", exp))
    return out, info


def _json_tests(text: str) -> list[Test] | None:
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"\[\s*\{", text)][-20:]
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) and "input" in v and "output" in v
                                                     for v in value):
            return [(_as_text(v["input"]), _as_text(v["output"])) for v in value]
    return None


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    return json.dumps(v)


def _labelled_tests(text: str) -> list[Test]:
    labels = list(_LABEL.finditer(text))
    tests = []
    for cur, nxt, after in zip(labels, labels[1:], labels[2:] + [None]):
        if cur.group(1).lower() == "input" and nxt.group(1).lower() == "output":
            end = after.start() if after is not None else len(text)
            tests.append((_unfence(text[cur.end():nxt.start()]), _unfence(text[nxt.end():end])))
    return tests


def format_tests(tests: Sequence[Test]) -> str:
    """Tests in the labelled format that ``parse_tests`` reads (used by the scripted tester)."""
    return "\n".join(f"**Input:**\n```\n{i.rstrip()}\n```\n**Output:**\n```\n{o.rstrip()}\n```" for i, o in tests)


# ---- comparing outputs ----------------------------------------------------------------------------------
def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def outputs_match(expected: str, got: str, function_mode: bool = False) -> bool:
    """Whitespace- and float-tolerant equality of two program outputs (see the module docstring)."""
    if function_mode:
        try:
            return _values_match(ast.literal_eval(expected.strip()), ast.literal_eval(got.strip()))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    want, have = expected.split(), got.split()
    if len(want) != len(have):
        return False
    for a, b in zip(want, have):
        if a != b and not (_NUMBER.fullmatch(a) and _NUMBER.fullmatch(b) and _close(float(a), float(b))):
            return False
    return True


def _values_match(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or _close(float(a), float(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_values_match(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_match(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def describe_failure(r: ExecResult) -> str:
    """What a failed run printed instead of an answer: the output, or why there is none."""
    if r.timed_out:
        return "<timed out>"
    if r.memory_exceeded:
        return "<memory limit exceeded>"
    if r.exit_code != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else (f"killed by signal {r.killed_by_signal}" if r.killed_by_signal
                                       else f"exit code {r.exit_code}")
        return f"<error: {why[:200]}>"
    return r.stdout


def passed(r: ExecResult, expected: str, function_mode: bool = False) -> bool:
    return r.ok and outputs_match(expected, r.stdout, function_mode)
