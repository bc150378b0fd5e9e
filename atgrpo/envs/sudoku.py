"""Sudoku: complete a 4x4 (2x2 boxes) or 9x9 (3x3 boxes) puzzle with a unique solution.

Roles as in Plan-Path: ``tool`` proposes an action that is *simulated on a copy* of the board and scored;
``plan`` sees the proposal, the board it leads to and whether it was consistent, and gives the action applied
to the real board. ``roles=("plan",)`` gives the single-agent (L0) variant. In ``tool_mode="code"`` (the
default with chat prompts) the tool writes a program (a solver) whose last printed line is its action, on one
line (a slash grid, a list of lists, or fills); in ``direct`` mode (the default with compact prompts) it types
the action; see ``tool_code``.

Puzzles: a random full grid (randomised backtracking), then cells are removed in random order while the solution
stays unique (a backtracking counter that stops at 2), until ``holes`` cells are empty.

Actions (parsed from free text, never raising; the match that ends last in the text is used):
- a grid: ``1234/3412/2143/4321``, one row per line (``1 2 | 3 4`` works), or a JSON list of lists; '.', '_'
  or 0 mark a cell left as it is. A grid that changes a given is REJECTED whole (nothing applied). Otherwise
  every non-given cell it names is cleared and refilled with its value, in row-major order.
- a list of ``(row, col, value)`` fills, rows and columns from 0, e.g. ``[(0,1,3), (2,2,4)]``; value 0 erases
  a non-given cell. A fill that changes a given is invalid: penalised, not applied.
Each fill is checked against the board as it stands (earlier fills of the action applied): a fill that would
repeat a digit in its row, column or box is a constraint violation: penalised and NOT applied, so the board
is always consistent. Non-given cells may be overwritten later.

Rewards: ``local`` = 0.1 x (change in the number of non-given cells that hold their solution digit) - 0.1 per
violation - 0.2 per fill on a given, +2 when the board is solved after the action; a rejected grid scores
``REJECT_PENALTY`` and an unparsable answer ``FORMAT_PENALTY`` (added to the rest when only part of the text
parsed; in code mode a program that crashes, times out or prints nothing readable also scores it). Solved
means the board equals the unique solution, so a valid grid that ignores the givens never counts.
``team`` = 1.0 when the real puzzle is solved after the step, else 0.0. With ``stall_penalty=True`` an action
that parses but leaves the board no closer to the solution (no more cells right than before, not solved)
scores ``FORMAT_PENALTY`` too, as a crash does: a program that runs and prints the board back is then no safe
harbour for a tool whose sampled programs mostly crash (off by default).

Expert action: the solution, as a slash grid in the compact style and as fills of the cells that differ from the
solution (wrong cells erased first) in the chat style; in code mode the tool writes a backtracking solver that
prints the slash grid (``expert_programs``).

Departures from the paper: the paper does not specify the progress reward; here progress is measured against
the unique solution, a potential-based signal (erasing then refilling a cell nets zero).
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from . import splits
from .base import Messages
from .expert_programs import sudoku_program
from .propose_execute import ProposeExecuteGame
from .tool_code import DEFAULT_TIMEOUT

FORMAT_PENALTY = -1.0  # below any parsed answer: silence must never be the safe choice
REJECT_PENALTY = -0.5
GIVEN_PENALTY = 0.2
VIOLATION_PENALTY = 0.1
PROGRESS = 0.1
SOLVE_BONUS = 2.0
DEFAULT_HOLES = {4: 8, 9: 40}
MAX_HOLES = {4: 12, 9: 55}

Board = list[int]  # n*n cells, row-major, 0 = empty

_TRIPLE = re.compile(r"[(\[]\s*(-?[0-9]+)\s*,\s*(-?[0-9]+)\s*,\s*(-?[0-9]+)\s*[)\]]")
_TRIPLE_GAP = re.compile(r"[\s,;\[\]]*")
_LIST_OF_LISTS = re.compile(r"\[\s*\[[^\[\]]*\](?:\s*,\s*\[[^\[\]]*\])*\s*,?\s*\]")
_ROW_LINE = re.compile(r"[\s0-9._,|\[\]]*")
_SEP_LINE = re.compile(r"[\s\-+|=]*")


def _box(n: int) -> int:
    return math.isqrt(n)


def solve(board: Board, n: int, limit: int = 2, rng: random.Random | None = None) -> tuple[int, Board | None]:
    """Count solutions of ``board`` up to ``limit`` by backtracking (fewest candidates first); also return the
    first solution found. With ``rng``, candidate digits are tried in random order (used to make full grids)."""
    b, full = _box(n), (1 << (n + 1)) - 2
    cells = list(board)
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    for i, v in enumerate(cells):
        if v:
            r, c = divmod(i, n)
            k, bit = (r // b) * b + c // b, 1 << v
            if (rows[r] | cols[c] | boxes[k]) & bit:
                return 0, None
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
    empties = [i for i, v in enumerate(cells) if not v]
    found: list[Board] = []
    count = 0

    def rec() -> bool:  # True: stop searching
        nonlocal count
        best, best_mask, best_n = -1, 0, n + 1
        for i in empties:
            if cells[i]:
                continue
            r, c = divmod(i, n)
            mask = full & ~(rows[r] | cols[c] | boxes[(r // b) * b + c // b])
            cnt = mask.bit_count()
            if cnt < best_n:
                best, best_mask, best_n = i, mask, cnt
                if cnt == 0:
                    return False
        if best < 0:
            count += 1
            if not found:
                found.append(cells[:])
            return count >= limit
        r, c = divmod(best, n)
        k = (r // b) * b + c // b
        digits = [d for d in range(1, n + 1) if best_mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        for d in digits:
            bit = 1 << d
            cells[best] = d
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
            if rec():
                return True
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[k] &= ~bit
        cells[best] = 0
        return False

    rec()
    return count, (found[0] if found else None)


def count_solutions(board: Board, n: int) -> int:
    """0, 1 or 2 (meaning: at least two)."""
    return solve(board, n, limit=2)[0]


def generate_puzzle(rng: random.Random, n: int, holes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(givens, solution): a random full grid with ``holes`` cells removed, the solution still unique."""
    for _ in range(100):
        _, grid = solve([0] * (n * n), n, limit=1, rng=rng)
        assert grid is not None
        puzzle, removed = grid[:], 0
        order = list(range(n * n))
        rng.shuffle(order)
        for i in order:
            if removed == holes:
                break
            v, puzzle[i] = puzzle[i], 0
            if count_solutions(puzzle, n) == 1:
                removed += 1
            else:
                puzzle[i] = v
        if removed == holes:
            return tuple(puzzle), tuple(grid)
    raise RuntimeError(f"sudoku: could not remove {holes} cells with a unique solution in 100 grids")


def slash(board: Board | tuple[int, ...], n: int) -> str:
    """Compact one-line form: rows separated by '/', '.' for empty, e.g. ``12.4/3412/2143/4321``."""
    return "/".join("".join(str(v) if v else "." for v in board[r * n:(r + 1) * n]) for r in range(n))


def render(board: Board | tuple[int, ...], n: int) -> str:
    """One row per line, '.' for empty."""
    return slash(board, n).replace("/", "\n")


def conflicts(board: Board, n: int, i: int, v: int) -> bool:
    """Would digit ``v`` at cell ``i`` repeat a digit of its row, column or box (cell ``i`` itself ignored)?"""
    b = _box(n)
    r, c = divmod(i, n)
    br, bc = (r // b) * b, (c // b) * b
    peers = {r * n + k for k in range(n)} | {k * n + c for k in range(n)}
    peers |= {(br + dr) * n + bc + dc for dr in range(b) for dc in range(b)}
    return any(board[j] == v for j in peers if j != i)


def parse_action(text: str, n: int) -> tuple[str, list[int] | list[tuple[int, int, int]], bool]:
    """Return (kind, payload, ok): kind "grid" with n*n cells (0 = leave), "fills" with (row, col, value)
    triples, or "none". ``ok`` is False when nothing was read or some cells / fills were out of range."""
    text = text[:20_000]
    cands: list[tuple[int, str, Any]] = []  # (end position, kind, raw)
    cell = re.compile(rf"(?<![0-9/])[0-9._]{{{n}}}(?:/[0-9._]{{{n}}}){{{n - 1}}}(?![0-9/])")
    for m in cell.finditer(text):
        cands.append((m.end(), "grid", [ch for ch in m.group() if ch != "/"]))
    for m in _LIST_OF_LISTS.finditer(text):
        inner = [re.findall(r"-?[0-9]+", s) for s in re.findall(r"\[([^\[\]]*)\]", m.group()[1:])]
        if len(inner) == n and all(len(row) == n for row in inner):
            cands.append((m.end(), "grid", [x for row in inner for x in row]))
    run: list[tuple[int, list[str]]] = []  # consecutive row lines (end position, cells)
    pos = 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        digits = re.findall(r"[0-9._]", line)
        if len(digits) == n and _ROW_LINE.fullmatch(line):
            run.append((pos, digits))
            if len(run) >= n:
                cands.append((pos, "grid", [x for _, row in run[-n:] for x in row]))
        elif not _SEP_LINE.fullmatch(line):
            run = []
    triples = list(_TRIPLE.finditer(text))
    if triples:
        start = len(triples) - 1  # the last cluster: triples separated only by commas, spaces and brackets
        while start > 0 and _TRIPLE_GAP.fullmatch(text, triples[start - 1].end(), triples[start].start()):
            start -= 1
        cands.append((triples[-1].end(), "fills", [tuple(int(x) for x in t.groups()) for t in triples[start:]]))
    if not cands:
        return "none", [], False
    _, kind, raw = max(cands, key=lambda x: x[0])
    ok = True
    if kind == "grid":
        grid = []
        for x in raw:
            v = int(x) if x.lstrip("-").isdigit() else 0
            if not 0 <= v <= n:
                v, ok = 0, False
            grid.append(v)
        return "grid", grid, ok
    fills = [(r, c, v) for r, c, v in raw if 0 <= r < n and 0 <= c < n and 0 <= v <= n]
    return "fills", fills, ok and len(fills) == len(raw) and bool(fills)


class SudokuEnv(ProposeExecuteGame):
    name = "sudoku"
    format_penalty = FORMAT_PENALTY

    def __init__(self, size: int = 4, max_turns: int = 4, style: str = "compact", split: str = "train",
                 roles: tuple[str, ...] | None = None, holes: int | None = None, tool_mode: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, stall_penalty: bool = False):
        """``tool_mode``: ``code`` | ``direct`` (default: code for chat, direct for compact); ``timeout``:
        seconds per tool program; ``stall_penalty``: score an action that makes no progress as unreadable."""
        super().__init__(max_turns=max_turns, style=style, roles=roles)
        if size not in DEFAULT_HOLES:
            raise ValueError(f"sudoku size must be 4 or 9, got {size}")
        holes = DEFAULT_HOLES[size] if holes is None else holes
        if not 1 <= holes <= MAX_HOLES[size]:
            raise ValueError(f"sudoku size {size} needs 1 <= holes <= {MAX_HOLES[size]}, got {holes}")
        self.n, self.holes, self.split, self.stall_penalty = size, holes, split, stall_penalty
        self._setup_tool(tool_mode, timeout, style)

    # ---- episode --------------------------------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        self.givens, self.solution = splits.draw(
            lambda rng: generate_puzzle(rng, self.n, self.holes), self.fingerprint_of,
            f"sudoku:{self.n}:{self.holes}", seed, self.split)
        self.board: Board = list(self.givens)
        self.problem_id = f"sudoku/{self.split}/{seed}"
        self.proposal: tuple[str, str] | None = None  # tool's (board after simulation, status code)
        self.tool_run = None  # code mode: the tool's latest program run

    def fingerprint_of(self, inst: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
        return f"{self.n}|{slash(inst[0], self.n)}"

    @property
    def success(self) -> bool:
        return tuple(self.board) == self.solution

    # ---- dynamics -------------------------------------------------------------------------------------
    def _correct(self, board: Board) -> int:
        return sum(1 for i, v in enumerate(board) if not self.givens[i] and v == self.solution[i])

    def simulate(self, board: Board, kind: str, payload: list) -> tuple[Board, float, dict[str, Any]]:
        """Apply a parsed action to a copy of ``board``: (new board, reward without format penalty, stats)."""
        n, new = self.n, list(board)
        stats: dict[str, Any] = {"rejected": False, "given_fills": 0, "violations": 0, "applied": 0, "gained": 0}
        if kind == "grid":
            if any(self.givens[i] and v and v != self.givens[i] for i, v in enumerate(payload)):
                stats["rejected"] = True
                return new, REJECT_PENALTY, stats
            fills = [(i, v) for i, v in enumerate(payload) if v and not self.givens[i]]
            for i, _ in fills:
                new[i] = 0
        else:
            fills = [(r * n + c, v) for r, c, v in payload]
        for i, v in fills:
            if self.givens[i]:
                stats["given_fills"] += v != self.givens[i]
            elif v and conflicts(new, n, i, v):
                stats["violations"] += 1
            else:
                new[i] = v
                stats["applied"] += 1
        stats["gained"] = self._correct(new) - self._correct(board)  # cells right now that were not before
        reward = PROGRESS * stats["gained"]
        reward -= GIVEN_PENALTY * stats["given_fills"] + VIOLATION_PENALTY * stats["violations"]
        if tuple(new) == self.solution and tuple(board) != self.solution:
            reward += SOLVE_BONUS
        return new, reward, stats

    # ---- the propose / execute step (``ProposeExecuteGame._apply``) ----------------------------------
    def _parse(self, text: str) -> tuple[tuple[str, list] | None, bool, dict[str, Any]]:
        kind, payload, ok = parse_action(text, self.n)
        return ((kind, payload) if kind != "none" and payload else None), ok, {"kind": kind}

    def _simulate(self, action: tuple[str, list]) -> tuple[Board, float, dict[str, Any]]:
        """``simulate`` on the real board; the stats also say whether the action was ``consistent`` (no grid
        rejected, no fill refused) and whether it ``stalled`` (no cell more right, not solved; scored as
        ``FORMAT_PENALTY`` under ``stall_penalty``)."""
        new, local, stats = self.simulate(self.board, *action)
        stats["consistent"] = not (stats["rejected"] or stats["given_fills"] or stats["violations"])
        stats["stalled"] = stats["gained"] <= 0 and tuple(new) != self.solution
        if self.stall_penalty and stats["stalled"]:
            local = min(local, FORMAT_PENALTY)
        return new, local, stats

    def _proposal(self, action: tuple[str, list], new: Board, stats: dict[str, Any]) -> tuple[str, str]:
        """(the board after simulation, status code: R rejected, S solved, C consistent, X<k> k refused fills)."""
        solved = tuple(new) == self.solution
        code = ("R" if stats["rejected"] else "S" if solved else "C" if stats["consistent"]
                else f"X{stats['given_fills'] + stats['violations']}")
        return slash(new, self.n), code

    def _execute(self, action: tuple[str, list], new: Board) -> None:
        self.board = new

    def expert_action(self, agent: str) -> str:
        """The tool: the backtracking program (code mode) or the solved grid. The plan agent: in chat, the tool's
        proposal as its prompt shows it (one row per line) when the proposal solves the puzzle (a teammate's
        solution is used, not re-derived, as in Plan-Path and Sokoban), else the fills that complete the board;
        in compact style the solved grid."""
        if agent == "tool" and self.tool_mode == "code":
            return self._wrap(self.expert_program())
        if self.style == "compact":
            return slash(self.solution, self.n)
        if agent == "plan" and self.proposal is not None and self.proposal[1] == "S":
            return self.proposal[0].replace("/", "\n")
        wrong = [i for i, v in enumerate(self.board) if v and v != self.solution[i]]
        todo = [i for i, v in enumerate(self.board) if v != self.solution[i]]
        fills = [(i, 0) for i in wrong] + [(i, self.solution[i]) for i in todo]
        return "[" + ", ".join(f"({i // self.n}, {i % self.n}, {v})" for i, v in fills) + "]"

    def expert_program(self, bug: str | None = None) -> str:
        return sudoku_program(render(self.givens, self.n), bug)

    def answer_alphabet(self) -> str:
        return "".join(str(d) for d in range(1, self.n + 1))

    # ---- prompts --------------------------------------------------------------------------------------
    def _compact(self, agent: str) -> str:
        """Fixed-format text for tiny policies: header, board, the tool's proposal (planner only), '>'.
        Proposal status codes: S solved, C consistent, X<k> k refused fills, R grid rejected (changed a given)."""
        head = f"{agent[0].upper()}{self.turn} E{self.board.count(0)}"
        lines = [head, render(self.board, self.n)]
        if agent == "plan" and "tool" in self.agents:
            lines.append("T:?" + self._program_mark() if self.proposal is None
                         else f"T:{self.proposal[0]} {self.proposal[1]}")
        elif agent == "tool" and self._program_mark():
            lines.append(self._program_mark().strip())
        return "\n".join(lines) + "\n>"

    def _chat(self, agent: str) -> Messages:
        n, b = self.n, _box(self.n)
        rules = (
            f"You are the {'tool agent' if agent == 'tool' else 'plan agent'} of a team solving a {n}x{n} Sudoku: "
            f"fill the grid so that every row, every column and every {b}x{b} box holds each digit 1-{n} exactly "
            "once. The given digits of the puzzle cannot be changed; a grid that changes one is rejected. '.' is "
            "an empty cell. Answer either with the full grid (one row per line, or rows separated by '/', e.g. "
            "1234/3412/2143/4321 for a 4x4 grid) or with a list of fills "
            "[(row, col, value), ...], rows and columns counted from 0 (value 0 erases a cell you filled). A "
            "fill that repeats a digit in its row, column or box is refused and penalised.")
        fmt = "Think briefly, then give your answer (the grid or the list of fills) last."
        if agent == "tool" and self.tool_mode == "code":
            task, fmt = self._tool_task("solves the puzzle (backtracking, say), writes the completed grid on one "
                                        "line with rows separated by '/',", "1234/3412/2143/4321" if n == 4 else
                                        "534678912/672195348/... (all 9 rows)"), ""
        elif agent == "tool":
            task = ("Propose an answer. It is checked on a copy of the board and shown to the plan agent, who "
                    "makes the real move.")
        else:
            task = "Give the answer that is applied to the board now."
        body = [f"Turn {self.turn + 1} of {self.max_turns}.", "Puzzle (givens):", render(self.givens, n),
                "Current board:", render(self.board, n)]
        body += self._program_report(agent)
        if self.proposal is not None and (agent == "plan" or self.tool_mode == "code"):
            board, code = self.proposal
            verdict = {"R": "was rejected because it changes a given", "S": "solves the puzzle",
                       "C": "is consistent (no refused fill) but does not complete the puzzle"}.get(
                code, f"had {code[1:]} refused fill(s) (conflicts or givens)")
            if agent == "plan":
                body += [f"Tool agent's proposal {verdict}. The board it leads to:", board.replace("/", "\n")]
            else:  # the tool copies the puzzle into its program: show it no second grid
                body.append(f"Your proposal, checked on the board back then, {verdict}.")
        return [{"role": "system", "content": f"{rules} {task} {fmt}".rstrip()},
                {"role": "user", "content": "\n".join(body)}]
