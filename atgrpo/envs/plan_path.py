"""Plan-Path: reach the goal on a grid with walls.

Roles, in turn order: ``tool`` proposes an action list that is *simulated on a copy* of the state and scored
(the real state does not move); ``plan`` sees the proposal and its simulated outcome and outputs the action
list that is executed on the real state. ``roles=("plan",)`` gives the single-agent (L0) variant.

The tool's proposal (``tool_mode``, ``tool_code``): in ``code`` mode, as in the paper, the tool writes a program
(e.g. a BFS) whose last printed line is the action list; in ``direct`` mode it types the list itself. Default:
``code`` with chat prompts, ``direct`` with compact prompts (the tiny policy).

Rewards per executed or simulated move: -0.01 per move, -0.1 for an invalid move
(position unchanged), potential shaping ``gamma * Phi' - Phi`` with ``Phi = -manhattan(pos, goal)``, +1.0 on
reaching the goal (execution stops there), +0.5 more when the list reached the goal in the BFS-optimal number
of moves from the position it started at. An unparsable answer (in code mode also a program that crashes,
times out or prints nothing readable) scores ``FORMAT_PENALTY``.
``local`` = that sum for the acting agent's own list; ``team`` = 1.0 when the real task is solved after the
step, else 0.0.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from . import splits
from .base import Messages
from .expert_programs import plan_path_program
from .moves import DELTAS, PROPOSAL_SHOWN, parse_moves, solving_proposal
from .propose_execute import ProposeExecuteGame
from .tool_code import DEFAULT_TIMEOUT

FORMAT_PENALTY = -1.0
STEP_COST = 0.01
INVALID_PENALTY = 0.1
GOAL_BONUS = 1.0
OPTIMAL_BONUS = 0.5
GAMMA = 0.99

Pos = tuple[int, int]


def bfs_path(size: int, walls: frozenset[Pos], start: Pos, goal: Pos) -> str | None:
    """A shortest move string from start to goal (fixed order U, D, L, R for determinism), or None."""
    prev: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        p = queue.popleft()
        if p == goal:
            out = []
            while prev[p] is not None:
                p, m = prev[p]  # type: ignore[misc]
                out.append(m)
            return "".join(reversed(out))
        for m, (dr, dc) in DELTAS.items():
            q = (p[0] + dr, p[1] + dc)
            if 0 <= q[0] < size and 0 <= q[1] < size and q not in walls and q not in prev:
                prev[q] = (p, m)
                queue.append(q)
    return None


def generate_grid(rng: random.Random, size: int, wall_prob: float, min_moves: int = 1
                  ) -> tuple[frozenset[Pos], Pos, Pos]:
    """Random walls with probability ``wall_prob``; distinct start and goal, reachable from each other in no
    fewer than ``min_moves`` moves (a near goal is reached by a fixed answer, a walk that ignores the grid)."""
    while True:
        walls = frozenset((r, c) for r in range(size) for c in range(size) if rng.random() < wall_prob)
        free = [(r, c) for r in range(size) for c in range(size) if (r, c) not in walls]
        if len(free) < 2:
            continue
        start, goal = rng.sample(free, 2)
        path = bfs_path(size, walls, start, goal)
        if path is not None and len(path) >= min_moves:
            return walls, start, goal


def render(size: int, walls: frozenset[Pos], pos: Pos, goal: Pos) -> str:
    """Rows of the grid: '#' wall, '.' free, 'A' the agent's current position, 'G' the goal."""
    rows = []
    for r in range(size):
        row = []
        for c in range(size):
            row.append("A" if (r, c) == pos else "G" if (r, c) == goal else "#" if (r, c) in walls else ".")
        rows.append("".join(row))
    return "\n".join(rows)


class PlanPathEnv(ProposeExecuteGame):
    name = "plan_path"
    format_penalty = FORMAT_PENALTY

    def __init__(self, size: int = 10, wall_prob: float = 0.22, max_turns: int = 4, style: str = "compact",
                 split: str = "train", roles: tuple[str, ...] | None = None, max_moves: int | None = None,
                 tool_mode: str | None = None, timeout: float = DEFAULT_TIMEOUT, min_moves: int = 1):
        """``tool_mode``: ``code`` | ``direct`` (default: code for chat, direct for compact); ``timeout``:
        seconds per tool program; ``min_moves``: the fewest moves from start to goal."""
        super().__init__(max_turns=max_turns, style=style, roles=roles)
        if size < 2 or not 0.0 <= wall_prob < 0.6:
            raise ValueError(f"plan_path needs size >= 2 and 0 <= wall_prob < 0.6, got {size}, {wall_prob}")
        if not 1 <= min_moves <= 2 * (size - 1):
            raise ValueError(f"plan_path needs 1 <= min_moves <= {2 * (size - 1)} (the farthest corners of a "
                             f"{size}x{size} grid), got {min_moves}")
        self.size, self.wall_prob, self.split, self.min_moves = size, wall_prob, split, min_moves
        self.max_moves = max_moves or 2 * size * size
        self._setup_tool(tool_mode, timeout, style)

    # ---- episode --------------------------------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        self.walls, self.start, self.goal = splits.draw(
            lambda rng: generate_grid(rng, self.size, self.wall_prob, self.min_moves), self.fingerprint_of,
            f"plan_path:{self.size}:{self.wall_prob}" + (f":{self.min_moves}" if self.min_moves > 1 else ""),
            seed, self.split)
        self.pos = self.start
        self.problem_id = f"plan_path/{self.split}/{seed}"
        self.proposal: tuple[str, Pos, bool] | None = None  # the tool's latest (moves, simulated end, reached)
        self.history: list[str] = []  # executed action lists, for the chat prompt
        self.tool_run = None  # code mode: the tool's latest program run

    def fingerprint_of(self, inst: tuple[frozenset[Pos], Pos, Pos]) -> str:
        walls, start, goal = inst
        return f"{self.size}|{render(self.size, walls, start, goal)}"

    @property
    def success(self) -> bool:
        return self.pos == self.goal

    # ---- dynamics -------------------------------------------------------------------------------------
    def simulate(self, start: Pos, moves: list[str]) -> tuple[Pos, float, dict[str, Any]]:
        """Run ``moves`` from ``start`` without touching the state: (end position, summed reward, stats)."""
        dist = lambda p: abs(p[0] - self.goal[0]) + abs(p[1] - self.goal[1])  # noqa: E731
        optimal_len = len(bfs_path(self.size, self.walls, start, self.goal) or "")
        pos, total, invalid, used = start, 0.0, 0, 0
        for m in moves:
            if pos == self.goal:
                break
            used += 1
            dr, dc = DELTAS[m]
            q = (pos[0] + dr, pos[1] + dc)
            valid = 0 <= q[0] < self.size and 0 <= q[1] < self.size and q not in self.walls
            total -= STEP_COST
            if valid:
                total += GAMMA * -dist(q) - -dist(pos)
                pos = q
            else:
                total -= INVALID_PENALTY
                invalid += 1
        reached = pos == self.goal
        if reached:
            total += GOAL_BONUS + (OPTIMAL_BONUS if used == optimal_len else 0.0)
        return pos, total, {"moves_used": used, "invalid_moves": invalid, "reached": reached}

    # ---- the propose / execute step (``ProposeExecuteGame._apply``) ----------------------------------
    def _parse(self, text: str) -> tuple[list[str] | None, bool, dict[str, Any]]:
        moves, ok = parse_moves(text, self.max_moves)
        return moves or None, ok, {"moves": "".join(moves)}

    def _simulate(self, moves: list[str]) -> tuple[Pos, float, dict[str, Any]]:
        return self.simulate(self.pos, moves)

    def _proposal(self, moves: list[str], end: Pos, stats: dict[str, Any]) -> tuple[str, Pos, bool]:
        return "".join(moves), end, stats["reached"]

    def _execute(self, moves: list[str], end: Pos) -> None:
        self.pos = end
        self.history.append("".join(moves))

    def expert_action(self, agent: str) -> str:
        """The plan agent repeats the tool's proposal when its simulation reached the goal (a teammate's
        solution is used, not re-derived: ``moves.solving_proposal``); otherwise, and for
        the tool, a BFS shortest path from the current position. In code mode the tool writes that BFS as a
        program (``expert_program``)."""
        if agent == "tool" and self.tool_mode == "code":
            return self._wrap(self.expert_program())
        p = self.proposal
        teammate = solving_proposal(agent, p and p[0], bool(p and p[2]))
        return teammate or bfs_path(self.size, self.walls, self.pos, self.goal) or ""

    def expert_program(self, bug: str | None = None) -> str:
        return plan_path_program(render(self.size, self.walls, self.pos, self.goal), bug)

    def answer_alphabet(self) -> str:
        return "UDLR"

    # ---- prompts --------------------------------------------------------------------------------------
    def _compact(self, agent: str) -> str:
        """Fixed-format text for tiny policies: header, grid, the tool's proposal (planner only), '>'.

        The header holds the role initial and turn, the current position, the goal, and the goal's
        displacement written in move letters (``to:D2R3`` = 2 rows down, 3 columns right), a representation a
        tiny model can learn quickly; walls can still make the straight path wrong."""
        dr, dc = self.goal[0] - self.pos[0], self.goal[1] - self.pos[1]
        disp = (f"{'D' if dr > 0 else 'U'}{abs(dr)}" if dr else "") + (f"{'R' if dc > 0 else 'L'}{abs(dc)}" if dc else "")
        head = (f"{agent[0].upper()}{self.turn} A{self.pos[0]},{self.pos[1]} G{self.goal[0]},{self.goal[1]} "
                f"to:{disp}")
        lines = [head, render(self.size, self.walls, self.pos, self.goal)]
        if agent == "plan" and "tool" in self.agents:
            if self.proposal is None:
                lines.append("T:?" + self._program_mark())
            else:
                moves, end, reached = self.proposal
                lines.append(f"T:{moves[:PROPOSAL_SHOWN]}@{end[0]},{end[1]}{'+' if reached else '-'}")
        elif agent == "tool" and self._program_mark():
            lines.append(self._program_mark().strip())
        return "\n".join(lines) + "\n>"

    def _chat(self, agent: str) -> Messages:
        rules = (
            f"You are the {'tool agent' if agent == 'tool' else 'plan agent'} of a team solving a path-planning "
            f"puzzle on a {self.size}x{self.size} grid. Cells: '#' wall, '.' free, 'A' your current position, "
            "'G' the goal. Moves: U (row-1), D (row+1), L (col-1), R (col+1); a move into a wall or off the grid "
            "leaves you in place. Rows and columns count from 0.")
        fmt = "Think briefly, then end with your answer as a list on the last line, e.g. [R, R, D, L]."
        if agent == "tool" and self.tool_mode == "code":
            task, fmt = self._tool_task("finds a move list taking A to G (a breadth-first search, say)",
                                        "RRDL or [R, R, D, L]"), ""
        elif agent == "tool":
            task = ("Propose a move list that takes A to G. Your proposal is simulated and shown to the plan "
                    "agent, who makes the real moves.")
        else:
            task = "Give the move list that is executed now, from the current position."
        body = [f"Turn {self.turn + 1} of {self.max_turns}.",
                f"Current position: row {self.pos[0]}, col {self.pos[1]}. Goal: row {self.goal[0]}, "
                f"col {self.goal[1]}.", "Grid:", render(self.size, self.walls, self.pos, self.goal)]
        if self.history:
            body.append("Moves executed so far: " + " then ".join(self.history))
        body += self._program_report(agent)
        if self.proposal is not None and (agent == "plan" or self.tool_mode == "code"):
            moves, end, reached = self.proposal
            who, when = ("Tool agent", "the current position") if agent == "plan" else ("You", "where you were")
            body.append(f"{who} proposed [{', '.join(moves)}]; simulated from {when} it ends "
                        f"at row {end[0]}, col {end[1]} ({'reaches' if reached else 'does not reach'} the goal).")
        return [{"role": "system", "content": f"{rules} {task} {fmt}".rstrip()},
                {"role": "user", "content": "\n".join(body)}]
