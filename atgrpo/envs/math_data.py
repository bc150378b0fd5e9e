"""Problems and answer checking for the math environment (``math_env.py``).

Problems
    ``arithmetic`` (reasoning-gym ``basic_arithmetic``) and ``gsm`` (reasoning-gym ``gsm_symbolic``) are generated:
    a problem index space of ``NUM_CHUNKS x CHUNK_SIZE`` items per dataset configuration, where chunk ``c`` is
    ``reasoning_gym.create_dataset(name, seed=c * CHUNK_SIZE, size=CHUNK_SIZE, **config)`` (cached, so a reset
    costs one item generation). ``draw_problem`` picks (chunk, index) from an RNG seeded by the episode seed and
    keeps drawing until the problem's fingerprint (its expression or question text, whitespace removed) falls
    in the requested split (``splits.draw``): train and eval problems are disjoint by content.
    Arithmetic items whose gold (reasoning-gym evaluates ``/`` as floor division) differs from the exact rational
    value of the expression (about 0.7% of them) are skipped, so every gold answer is the true value.

    ``jsonl`` reads evaluation problems (AIME, OlympiadBench, MATH, ...) from a local JSON Lines file, one record
    per line: ``{"problem": "<statement>", "answer": "<final answer, LaTeX or plain>"}`` (extra keys are ignored;
    an integer answer is accepted). Convert other layouts first, e.g. OlympiadBench ``final_answer[0]`` ->
    ``answer``, MATH: the ``\\boxed{}`` of ``solution`` -> ``answer``. All records are evaluation problems.

Answers
    ``math-verify`` decides equivalence (``1/2``, ``0.5`` and ``\\frac{1}{2}`` are one answer). Its own timeouts use
    signals (main thread only), so they are switched off and replaced by a guard that refuses inputs that can make
    sympy run away (``is_safe``: towers of powers, big exponents, factorials or binomials, sums, integrals, limits,
    more than ``MAX_ANSWER_CHARS`` characters); gold answers are trusted. What passes the guard is parsed in
    milliseconds to a few seconds (e.g. ``\\sin(999^{999})``), once per distinct string (cached). Plain-number
    answers (below) never reach sympy's hard cases. ``parse_answer`` / ``is_correct`` / ``equivalent`` never
    raise: a refused, unparsable or crashing input is "no answer", counted in ``STATS``.
    Departure: where the gold answer is a plain number (arithmetic, gsm) an answer must be a number too
    (integer, decimal, ``a/b``, ``\\frac{a}{b}``, scientific notation), else it is refused: math-verify would
    accept ``\\boxed{12+7*3}`` as the value of ``12+7*3``, which lets a policy restate the question.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import random
import re
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from . import splits

GENERATED = {"arithmetic": "basic_arithmetic", "gsm": "gsm_symbolic"}  # our name -> reasoning-gym name
DATASETS = (*GENERATED, "jsonl", "files")
CHUNK_SIZE = 256
NUM_CHUNKS = 1 << 16
MAX_ANSWER_CHARS = 200
JSONL_LAYOUT = ('JSON Lines, one record per line: {"problem": "<statement>", "answer": "<final answer>"} '
                "(see atgrpo/envs/math_data.py)")

STATS: Counter = Counter()  # outcomes per distinct input (cached): ok / empty / refused / error, verify_error


@dataclass(frozen=True)
class Problem:
    question: str  # the full statement shown in chat prompts
    answer: str  # the gold answer
    source: str  # "arithmetic" | "gsm" | "jsonl:<file name>"
    index: str  # where it came from: "chunk:item" or the JSONL line number
    expression: str | None = None  # arithmetic: the Python expression (spaces removed; '/' exact)

    @property
    def compact(self) -> str:
        """The question in compact prompts: the bare expression for arithmetic, else the collapsed text."""
        return f"{self.expression}=?" if self.expression else " ".join(self.question.split())

    @property
    def numeric(self) -> bool:
        return _number_value(self.answer) is not None


def fingerprint(p: Problem) -> str:
    """The problem's content, whitespace removed: decides its split (the same expression, however phrased,
    is always in the same split)."""
    return re.sub(r"\s+", "", p.expression or p.question.lower())


# ---- generated problems (reasoning-gym) ----------------------------------------------------------------------
def _freeze(obj: Any) -> Any:
    if isinstance(obj, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return tuple(_freeze(v) for v in obj)
    return obj


@functools.lru_cache(maxsize=256)
def _chunk(name: str, config: tuple, chunk: int):
    """One reasoning-gym dataset of CHUNK_SIZE items (lazy: items are generated on access)."""
    import reasoning_gym  # ~1 s to import; only when a generated dataset is used

    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in config}
    return reasoning_gym.create_dataset(name, seed=chunk * CHUNK_SIZE, size=CHUNK_SIZE, **kwargs)


def _exact_value(expr: str) -> Fraction | None:
    """The exact value of an arithmetic expression (+ - * / and unary minus), or None (division by zero)."""
    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div):
                return a / b
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        raise ValueError(f"unexpected node {ast.dump(node)}")

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except ZeroDivisionError:
        return None


@functools.lru_cache(maxsize=65536)
def _item(dataset: str, config: tuple, chunk: int, idx: int) -> Problem | None:
    entry = _chunk(GENERATED[dataset], config, chunk)[idx]
    expression = None
    if dataset == "arithmetic":
        expression = re.sub(r"\s+", "", entry["metadata"]["expression"])
        if _exact_value(expression) != Fraction(int(entry["answer"])):
            return None  # reasoning-gym's gold is a floor division here: not the true value
    return Problem(entry["question"], str(entry["answer"]), dataset, f"{chunk}:{idx}", expression)


def draw_problem(dataset: str, seed: int, split: str, config: dict[str, Any] | None = None) -> Problem:
    """The generated problem of ``seed`` in ``split`` (deterministic; train and eval disjoint by content)."""
    if dataset not in GENERATED:
        raise ValueError(f"unknown generated math dataset {dataset!r}; valid: {', '.join(GENERATED)}")
    frozen = _freeze(config or {})

    def generate(rng: random.Random) -> Problem:
        while True:
            p = _item(dataset, frozen, rng.randrange(NUM_CHUNKS), rng.randrange(CHUNK_SIZE))
            if p is not None:
                return p

    return splits.draw(generate, fingerprint, f"math:{dataset}:{frozen}", seed, split)


# ---- local JSONL files -----------------------------------------------------------------------------------------
def load_files(data_files, columns: dict[str, str] | None = None) -> tuple[Problem, ...]:
    """Problems of local JSON / JSONL / Parquet / CSV files read with ``datasets`` (``data_files.py``): columns
    problem and answer (renamed by ``columns``: field -> column)."""
    from .data_files import as_list, load_table

    rows = load_table(data_files, ("problem", "answer"), (), columns)
    name = os.path.basename(as_list(data_files)[0])
    out = []
    for i, r in enumerate(rows):
        q, a = r["problem"], r["answer"]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            a = str(a)
        if not (isinstance(q, str) and q.strip() and isinstance(a, str) and a.strip()):
            raise ValueError(f"{name} row {i}: needs a non-empty text 'problem' and 'answer' (got {q!r}, {a!r})")
        out.append(Problem(q, a.strip(), f"files:{name}", str(i)))
    return tuple(out)


def load_jsonl(path: str) -> tuple[Problem, ...]:
    """All records of a JSONL file of {"problem", "answer"} records (cached until the file changes)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"math dataset file not found: {path!r}; expected {JSONL_LAYOUT}")
    st = os.stat(path)
    return _load_jsonl(os.path.abspath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _load_jsonl(path: str, mtime_ns: int, size: int) -> tuple[Problem, ...]:
    name, out = os.path.basename(path), []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}); expected {JSONL_LAYOUT}") from None
            ok = (isinstance(rec, dict) and isinstance(rec.get("problem"), str) and rec["problem"].strip()
                  and isinstance(rec.get("answer"), (str, int)) and not isinstance(rec.get("answer"), bool)
                  and str(rec["answer"]).strip())
            if not ok:
                raise ValueError(f"{path}:{n}: record needs a non-empty string 'problem' and 'answer'; "
                                 f"expected {JSONL_LAYOUT}")
            out.append(Problem(rec["problem"], str(rec["answer"]).strip(), f"jsonl:{name}", str(n)))
    if not out:
        raise ValueError(f"{path}: no records; expected {JSONL_LAYOUT}")
    return tuple(out)


# ---- answers ---------------------------------------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
        j += 1
    return None


_INT = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)"
_NUMBER = re.compile(rf"{_INT}(?:\.\d*)?(?:[eE][+-]?\d+)?|[+-]?\.\d+(?:[eE][+-]?\d+)?")
_FRACTION = re.compile(rf"(?P<s>[+-]?)\\[dt]?frac\{{(?P<a>{_INT})\}}\{{(?P<b>{_INT})\}}"
                       rf"|(?P<c>{_INT})/(?P<d>{_INT})")


def _clean(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = s.replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    return s[len("\\$"):].strip() if s.startswith("\\$") else s


def _number_value(s: str) -> Fraction | None:
    """The value of a plain number (integer, decimal, a/b, \\frac{a}{b}, scientific notation), else None."""
    s = _clean(s)
    try:
        if _NUMBER.fullmatch(s):
            return Fraction(Decimal(s.replace(",", "")))
        m = _FRACTION.fullmatch(s)
        if m:
            a, b = (m["a"], m["b"]) if m["a"] else (m["c"], m["d"])
            val = Fraction(int(a.replace(",", "")), int(b.replace(",", "")))
            return -val if m["s"] == "-" else val
    except (InvalidOperation, ZeroDivisionError, ValueError):
        return None
    return None


_POWER = re.compile(r"\^|\*\*")
_NUM_4 = re.compile(r"\d{4,}")
_TOKEN = re.compile(r"[-+]?(?:\\[A-Za-z]+|[\w.])+")
_BANNED = re.compile(r"\\(?:sum|prod|int|iint|oint|lim|binom|dbinom|tbinom|choose|Gamma)(?![A-Za-z])"
                     r"|gamma|factorial|!")


def _exponent(s: str, i: int) -> tuple[str, int]:
    """The exponent that starts at ``s[i]`` (a braced or parenthesised group, or one token) and its end."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] in "{(":
        close, depth, j = "}" if s[i] == "{" else ")", 0, i
        while j < len(s):
            depth += 1 if s[j] == s[i] else -1 if s[j] == close else 0
            if depth == 0:
                return s[i + 1:j], j + 1
            j += 1
        return s[i + 1:], len(s)
    m = _TOKEN.match(s, i)
    return (m.group(), m.end()) if m else ("", i)


def _base_group(s: str, i: int) -> str:
    """The bracketed group that ends just before ``s[i]`` (the base of a power), or '' if the base is no group."""
    j = len(s[:i].rstrip()) - 1
    if j < 0 or s[j] not in ")}]":
        return ""
    close, depth = s[j], 0
    opening = {")": "(", "}": "{", "]": "["}[close]
    for k in range(j, -1, -1):
        depth += 1 if s[k] == close else -1 if s[k] == opening else 0
        if depth == 0:
            return s[k:j + 1]
    return s[:j + 1]


def is_safe(s: str) -> bool:
    """False for inputs that can keep sympy busy for minutes: too long; sums, products, integrals, limits,
    factorials, binomials, Gamma; towers of powers (``a^b^c``, ``a^{b^c}``, ``(a^b)^c``), or exponents with a
    number of 4+ digits."""
    if len(s) > MAX_ANSWER_CHARS:
        return False
    if _BANNED.search(s.replace("\\!", "")):
        return False
    for m in _POWER.finditer(s):
        exp, end = _exponent(s, m.end())
        if (_POWER.search(exp) or _NUM_4.search(exp) or _POWER.match(s[end:].lstrip())
                or _POWER.search(_base_group(s, m.start()))):
            return False
    return True


def _quiet_math_verify() -> None:
    """math-verify warns (once) that its timeouts are off; ``is_safe`` is our replacement, so drop that line."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(lambda r: "Timeout is disabled" not in r.getMessage())


@functools.lru_cache(maxsize=65536)
def parse_answer(s: str, numeric: bool = False, trusted: bool = False) -> tuple | None:
    """math-verify's parse of an answer string, or None when it is refused, empty or parsing fails.
    ``numeric``: only plain numbers are accepted (see the module docstring); ``trusted`` (gold answers): skip
    ``is_safe``. Never raises."""
    from math_verify import parse

    if not s or not s.strip() or not (trusted or is_safe(s)):
        STATS["refused"] += 1
        return None
    text = _clean(s)
    if numeric:
        value = _number_value(text)
        if value is None:
            STATS["refused"] += 1
            return None
        text = f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value.numerator)
    try:
        out = parse(f"${text}$", parsing_timeout=None)
    except Exception:  # noqa: BLE001 -- math-verify/sympy raise many types on junk; a failure is data
        STATS["error"] += 1
        return None
    STATS["ok" if out else "empty"] += 1
    return tuple(out) if out else None


@functools.lru_cache(maxsize=65536)
def _verify(gold: str, answer: str, numeric: bool, trusted_gold: bool) -> bool:
    from math_verify import verify

    pg, pa = parse_answer(gold, numeric, trusted_gold), parse_answer(answer, numeric)
    if pg is None or pa is None:
        return False
    try:
        return bool(verify(list(pg), list(pa), timeout_seconds=None))
    except Exception:  # noqa: BLE001 -- see parse_answer
        STATS["verify_error"] += 1
        return False


def is_correct(gold: str, answer: str | None, numeric: bool = False) -> bool:
    """``verify(parse(gold), parse(answer))``; False for a missing or unparsable answer. Never raises."""
    return answer is not None and _verify(gold, answer, numeric, True)


def equivalent(a: str | None, b: str | None, numeric: bool = False) -> bool:
    """Whether two answers are the same answer (math-verify, in either order). Never raises."""
    return a is not None and b is not None and (_verify(a, b, numeric, False) or _verify(b, a, numeric, False))


_quiet_math_verify()
