"""The scripted tool agent's programs for the games in ``tool_mode="code"``, and their buggy variants.

Each function returns the source of a self-contained Python program (standard library only) that holds the
instance as a string literal, exactly as the prompt shows it, reads it back from that text, solves it and
prints the answer on its last line: a BFS move string (Plan-Path), a BFS over (player, boxes) states with dead
squares pruned (Sokoban), a backtracking solution in slash form (Sudoku). Nothing here is imported by the
programs: they run in the sandbox, which hides atgrpo's source.

``bug`` makes the program wrong in one of the ways a model's program goes wrong, for noisy warm-start
demonstrations: ``"crash"`` (an undefined name in the final print: NameError), ``"silent"`` (the answer is
computed but never printed), ``"wrong"`` (a wrong answer that is still readable: the U and D letters swapped
in the move table, or the Sudoku grid printed transposed).
"""

from __future__ import annotations

BUGS = ("crash", "silent", "wrong")

_MOVES = 'MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}'
_MOVES_SWAPPED = 'MOVES = {"U": (1, 0), "D": (-1, 0), "L": (0, -1), "R": (0, 1)}'

_PLAN_PATH = '''from collections import deque

GRID = """
@INSTANCE@
"""

rows = GRID.strip().splitlines()
cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
start = next(p for p, ch in cells.items() if ch == "A")
goal = next(p for p, ch in cells.items() if ch == "G")
@MOVES@
prev = {start: None}
queue = deque([start])
while queue:
    p = queue.popleft()
    if p == goal:
        break
    for m, (dr, dc) in MOVES.items():
        q = (p[0] + dr, p[1] + dc)
        if cells.get(q, "#") != "#" and q not in prev:
            prev[q] = (p, m)
            queue.append(q)
path = []
p = goal
while prev[p] is not None:
    p, m = prev[p]
    path.append(m)
@EMIT@
'''

_SOKOBAN = '''from collections import deque

GRID = """
@INSTANCE@
"""

rows = GRID.strip().splitlines()
walls, goals, boxes, player = set(), set(), set(), None
for r, row in enumerate(rows):
    for c, ch in enumerate(row):
        if ch == "#":
            walls.add((r, c))
        if ch in "_*+":
            goals.add((r, c))
        if ch in "B*":
            boxes.add((r, c))
        if ch in "A+":
            player = (r, c)
@MOVES@


def free(p):
    return 0 <= p[0] < len(rows) and 0 <= p[1] < len(rows[p[0]]) and p not in walls


start = (player, frozenset(boxes))
prev = {start: None}
queue = deque([start])
end = None
while queue:
    state = queue.popleft()
    if state[1] <= goals:
        end = state
        break
    p, bs = state
    for m, (dr, dc) in MOVES.items():
        q = (p[0] + dr, p[1] + dc)
        if not free(q):
            continue
        nb = bs
        if q in bs:
            t = (q[0] + dr, q[1] + dc)
            if not free(t) or t in bs:
                continue
            nb = (bs - {q}) | {t}
        nxt = (q, nb)
        if nxt not in prev:
            prev[nxt] = (state, m)
            queue.append(nxt)
path = []
state = end
while prev[state] is not None:
    state, m = prev[state]
    path.append(m)
@EMIT@
'''

_SUDOKU = '''PUZZLE = """
@INSTANCE@
"""

rows = PUZZLE.strip().splitlines()
n = len(rows)
b = int(round(n ** 0.5))
cells = [0 if ch == "." else int(ch) for row in rows for ch in row.strip()]


def candidates(i):
    r, c = divmod(i, n)
    used = {cells[r * n + k] for k in range(n)} | {cells[k * n + c] for k in range(n)}
    br, bc = r // b * b, c // b * b
    used |= {cells[(br + dr) * n + bc + dc] for dr in range(b) for dc in range(b)}
    return [d for d in range(1, n + 1) if d not in used]


def solve():
    empty = [i for i, v in enumerate(cells) if v == 0]
    if not empty:
        return True
    i = min(empty, key=lambda j: len(candidates(j)))
    for d in candidates(i):
        cells[i] = d
        if solve():
            return True
    cells[i] = 0
    return False


solve()
@EMIT@
'''

_EMITS = {
    "moves": ('print("".join(reversed(path)))', 'print("".join(reversed(pth)))', 'answer = "".join(reversed(path))'),
    "grid": ('print("/".join("".join(str(cells[r * n + c]) for c in range(n)) for r in range(n)))',
             'print("/".join("".join(str(cell[r * n + c]) for c in range(n)) for r in range(n)))',
             'answer = "/".join("".join(str(cells[r * n + c]) for c in range(n)) for r in range(n))'),
}
_TRANSPOSED = 'print("/".join("".join(str(cells[c * n + r]) for c in range(n)) for r in range(n)))'


def _check(bug: str | None) -> None:
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown program bug {bug!r}; valid: {', '.join(BUGS)}")


def _emit(kind: str, bug: str | None) -> str:
    right, crash, silent = _EMITS[kind]
    return {"crash": crash, "silent": silent}.get(bug or "", right)


def _moves_program(template: str, grid: str, bug: str | None) -> str:
    _check(bug)
    return (template.replace("@INSTANCE@", grid).replace("@MOVES@", _MOVES_SWAPPED if bug == "wrong" else _MOVES)
            .replace("@EMIT@", _emit("moves", bug)))


def plan_path_program(grid: str, bug: str | None = None) -> str:
    """A BFS over the grid's cells ('#' wall, 'A' start, 'G' goal) that prints a shortest move string."""
    return _moves_program(_PLAN_PATH, grid, bug)


def sokoban_program(grid: str, bug: str | None = None) -> str:
    """A BFS over (player, boxes) states of the room that prints a shortest solving move string (symbols as in
    the Sokoban prompt). No dead-square pruning: the rooms are small (6x6, two boxes: a few thousand states, well
    inside the time limit), and a shorter program is easier for a small model to learn to write."""
    return _moves_program(_SOKOBAN, grid, bug)


def sudoku_program(puzzle: str, bug: str | None = None) -> str:
    """Backtracking (fewest candidates first) from the givens ('.' empty, one row per line); prints the
    solution as rows separated by '/'."""
    _check(bug)
    emit = _TRANSPOSED if bug == "wrong" else _emit("grid", bug)
    return _SUDOKU.replace("@INSTANCE@", puzzle).replace("@EMIT@", emit)
