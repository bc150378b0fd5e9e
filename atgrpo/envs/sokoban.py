"""Sokoban: push every box onto a goal in a small generated room.

Roles as in Plan-Path: ``tool`` proposes a move list that is *simulated on a copy* of the state and scored (the
real state does not move); ``plan`` sees the proposal and its simulated outcome and outputs the move list that is
executed on the real state. ``roles=("plan",)`` gives the single-agent (L0) variant. As in Plan-Path, the tool
writes a program that prints its move list in ``tool_mode="code"`` (the default with chat prompts), and types
the list in ``direct`` mode (the default with compact prompts); see ``tool_code``.

Rooms: a wall border, random interior walls (the floor stays connected), goals on random floor cells, boxes on
random non-goal cells that are not dead squares, the player on a free cell. An instance is kept only when a BFS
solver over (player, boxes) states solves it within ``SOLVER_CAP`` states (random placement then verification,
instead of gym-sokoban's reverse play). Moves U/D/L/R; moving into a box pushes it when the cell behind it is
free floor (no box, no wall).

Rewards per executed or simulated move: -0.01 per move, -0.05 more for an invalid move
(nothing moved), +1 for a box pushed onto a goal, -0.5 for a box pushed off a goal, shaping
``+0.1 * (D - D')`` with D the sum over boxes of the Manhattan distance to the nearest goal, +10 on solving
(execution stops there). An unparsable answer (in code mode also a program that crashes, times out or prints
nothing readable) scores ``FORMAT_PENALTY``. ``local`` = that sum for the acting agent's own list; ``team`` =
1.0 when the real puzzle is solved after the step, else 0.0. The episode ends early (``_ends_early``) once a
box stands on a dead square: a non-goal cell from which no sequence of pushes can bring a lone box to any goal
(corners, most wall edges).

Compact grid symbols: '#' wall, '.' floor, '_' goal, 'B' box, '*' box on a goal, 'A' player, '+' player on a goal.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import splits
from .base import Messages
from .expert_programs import sokoban_program
from .moves import DELTAS, PROPOSAL_SHOWN, parse_moves, solving_proposal
from .propose_execute import ProposeExecuteGame
from .tool_code import DEFAULT_TIMEOUT

FORMAT_PENALTY = -1.0  # below any parsed answer: silence must never be the safe choice
STEP_COST = 0.01
INVALID_PENALTY = 0.05
BOX_ON_GOAL = 1.0
BOX_OFF_GOAL = 0.5
SHAPING = 0.1
SOLVE_BONUS = 10.0
WALL_PROB = 0.12  # chance that an interior cell is a wall
SOLVER_CAP = 200_000  # most (player, boxes) states the solver visits before giving up

Pos = tuple[int, int]
Boxes = tuple[Pos, ...]  # always sorted, so that equal box sets compare equal


def _add(p: Pos, d: Pos, k: int = 1) -> Pos:
    return (p[0] + k * d[0], p[1] + k * d[1])


@dataclass(frozen=True)
class Room:
    """The fixed part of a puzzle: walls (border included), goals, and the live squares derived from them."""

    size: int
    walls: frozenset[Pos]
    goals: frozenset[Pos]
    live: frozenset[Pos] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "live", self._live_squares())

    def free(self, p: Pos) -> bool:
        return 0 <= p[0] < self.size and 0 <= p[1] < self.size and p not in self.walls

    def _live_squares(self) -> frozenset[Pos]:
        """Cells from which a lone box can be pushed onto some goal, found by pulling boxes back from the goals."""
        live, queue = set(self.goals), deque(self.goals)
        while queue:
            b = queue.popleft()
            for d in DELTAS.values():
                prev, player = _add(b, d, -1), _add(b, d, -2)  # box pushed from prev by a player at prev - d
                if prev not in live and self.free(prev) and self.free(player):
                    live.add(prev)
                    queue.append(prev)
        return frozenset(live)

    def move(self, player: Pos, boxes: Boxes, m: str) -> tuple[Pos, Boxes, Pos | None, Pos | None] | None:
        """One move: (player, boxes, pushed box's old cell, its new cell), or None when nothing can move."""
        d = DELTAS[m]
        q = _add(player, d)
        if not self.free(q):
            return None
        if q not in boxes:
            return q, boxes, None, None
        t = _add(q, d)
        if not self.free(t) or t in boxes:
            return None
        return q, tuple(sorted(t if b == q else b for b in boxes)), q, t

    def solved(self, boxes: Boxes) -> bool:
        return all(b in self.goals for b in boxes)

    def box_distance(self, boxes: Boxes) -> int:
        return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in self.goals) for b in boxes)

    def deadlocked(self, boxes: Boxes) -> bool:
        return any(b not in self.live for b in boxes)

    def solve(self, player: Pos, boxes: Boxes, cap: int = SOLVER_CAP) -> str | None:
        """A shortest move string (BFS, fixed order U, D, L, R) that solves the puzzle; None when unsolvable or
        when more than ``cap`` states were visited. Pushes onto dead squares are pruned."""
        start = (player, boxes)
        if self.solved(boxes):
            return ""
        prev: dict[tuple[Pos, Boxes], tuple[tuple[Pos, Boxes], str] | None] = {start: None}
        queue = deque([start])
        while queue:
            s = queue.popleft()
            for m in DELTAS:
                nxt = self.move(s[0], s[1], m)
                if nxt is None or (nxt[3] is not None and nxt[3] not in self.live):
                    continue
                t = (nxt[0], nxt[1])
                if t in prev:
                    continue
                prev[t] = (s, m)
                if self.solved(t[1]):
                    out = []
                    while prev[t] is not None:
                        t, mv = prev[t]  # type: ignore[misc]
                        out.append(mv)
                    return "".join(reversed(out))
                if len(prev) > cap:
                    return None
                queue.append(t)
        return None

    def render(self, player: Pos, boxes: Boxes) -> str:
        """Rows of the room with the symbols of the module docstring."""
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                p, goal = (r, c), (r, c) in self.goals
                if p in self.walls:
                    row.append("#")
                elif p in boxes:
                    row.append("*" if goal else "B")
                elif p == player:
                    row.append("+" if goal else "A")
                else:
                    row.append("_" if goal else ".")
            rows.append("".join(row))
        return "\n".join(rows)


def _connected(cells: list[Pos]) -> bool:
    todo, seen = set(cells), {cells[0]}
    queue = deque([cells[0]])
    while queue:
        p = queue.popleft()
        for d in DELTAS.values():
            q = _add(p, d)
            if q in todo and q not in seen:
                seen.add(q)
                queue.append(q)
    return len(seen) == len(todo)


def generate_room(rng: random.Random, size: int, num_boxes: int) -> tuple[Room, Pos, Boxes]:
    """A random room with ``num_boxes`` boxes and goals, not solved at the start, solvable within the cap."""
    border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    while True:
        walls = frozenset(border | {p for p in inner if rng.random() < WALL_PROB})
        floor = [p for p in inner if p not in walls]
        if len(floor) < 2 * num_boxes + 2 or not _connected(floor):
            continue
        room = Room(size, walls, frozenset(rng.sample(floor, num_boxes)))
        spots = [p for p in floor if p in room.live and p not in room.goals]
        if len(spots) < num_boxes:
            continue
        boxes = tuple(sorted(rng.sample(spots, num_boxes)))
        player = rng.choice([p for p in floor if p not in boxes])
        if room.solve(player, boxes) is not None:
            return room, player, boxes


def _fmt(ps: Boxes) -> str:
    return ";".join(f"{r},{c}" for r, c in ps)


class SokobanEnv(ProposeExecuteGame):
    name = "sokoban"
    format_penalty = FORMAT_PENALTY

    def __init__(self, size: int = 6, num_boxes: int = 1, max_turns: int = 4, style: str = "compact",
                 split: str = "train", roles: tuple[str, ...] | None = None, max_moves: int | None = None,
                 tool_mode: str | None = None, timeout: float = DEFAULT_TIMEOUT):
        """``tool_mode``: ``code`` | ``direct`` (default: code for chat, direct for compact); ``timeout``:
        seconds per tool program."""
        super().__init__(max_turns=max_turns, style=style, roles=roles)
        if size < 5 or num_boxes < 1 or 2 * num_boxes + 2 > (size - 2) ** 2:
            raise ValueError(f"sokoban needs size >= 5 and 1 <= num_boxes with room to spare, got {size}, "
                             f"{num_boxes}")
        self.size, self.num_boxes, self.split = size, num_boxes, split
        self.max_moves = max_moves or 3 * size * size
        self._setup_tool(tool_mode, timeout, style)

    # ---- episode --------------------------------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        self.room, self.player, self.boxes = splits.draw(
            lambda rng: generate_room(rng, self.size, self.num_boxes), self.fingerprint_of,
            f"sokoban:{self.size}:{self.num_boxes}", seed, self.split)
        self.problem_id = f"sokoban/{self.split}/{seed}"
        self.proposal: tuple[str, Pos, Boxes, bool] | None = None  # tool's (moves, end player, end boxes, solved)
        self.history: list[str] = []  # executed move lists, for the chat prompt
        self.tool_run = None  # code mode: the tool's latest program run

    def fingerprint_of(self, inst: tuple[Room, Pos, Boxes]) -> str:
        room, player, boxes = inst
        return f"{self.size}|{self.num_boxes}|{room.render(player, boxes)}"

    @property
    def success(self) -> bool:
        return self.room.solved(self.boxes)

    def _ends_early(self) -> bool:
        """The puzzle can no longer be solved: a box stands on a dead square."""
        return self.room.deadlocked(self.boxes)

    # ---- dynamics -------------------------------------------------------------------------------------
    def simulate(self, player: Pos, boxes: Boxes, moves: list[str]) -> tuple[Pos, Boxes, float, dict[str, Any]]:
        """Run ``moves`` without touching the state: (end player, end boxes, summed reward, stats)."""
        room = self.room
        total, invalid, used, pushes = 0.0, 0, 0, 0
        was_solved = room.solved(boxes)
        for m in moves:
            if room.solved(boxes):
                break
            used += 1
            total -= STEP_COST
            nxt = room.move(player, boxes, m)
            if nxt is None:
                total -= INVALID_PENALTY
                invalid += 1
                continue
            player, new_boxes, frm, to = nxt
            if frm is not None and to is not None:
                pushes += 1
                if to in room.goals and frm not in room.goals:
                    total += BOX_ON_GOAL
                elif frm in room.goals and to not in room.goals:
                    total -= BOX_OFF_GOAL
                total += SHAPING * (room.box_distance(boxes) - room.box_distance(new_boxes))
            boxes = new_boxes
        solved = room.solved(boxes)
        if solved and not was_solved:
            total += SOLVE_BONUS
        return player, boxes, total, {"moves_used": used, "invalid_moves": invalid, "pushes": pushes,
                                      "solved_by_moves": solved, "deadlocked": room.deadlocked(boxes)}

    # ---- the propose / execute step (``ProposeExecuteGame._apply``) ----------------------------------
    def _parse(self, text: str) -> tuple[list[str] | None, bool, dict[str, Any]]:
        moves, ok = parse_moves(text, self.max_moves)
        return moves or None, ok, {"moves": "".join(moves)}

    def _simulate(self, moves: list[str]) -> tuple[tuple[Pos, Boxes], float, dict[str, Any]]:
        player, boxes, local, stats = self.simulate(self.player, self.boxes, moves)
        return (player, boxes), local, stats

    def _proposal(self, moves: list[str], end: tuple[Pos, Boxes],
                  stats: dict[str, Any]) -> tuple[str, Pos, Boxes, bool]:
        return "".join(moves), end[0], end[1], stats["solved_by_moves"]

    def _execute(self, moves: list[str], end: tuple[Pos, Boxes]) -> None:
        self.player, self.boxes = end
        self.history.append("".join(moves))

    def expert_action(self, agent: str) -> str:
        """The plan agent repeats the tool's proposal when its simulation solved the puzzle (a teammate's
        solution is used, not re-derived: ``moves.solving_proposal``); otherwise, and for
        the tool, the BFS solver's shortest move string from the current state ('' when it finds none). In code
        mode the tool writes such a solver as a program (``expert_program``)."""
        if agent == "tool" and self.tool_mode == "code":
            return self._wrap(self.expert_program())
        p = self.proposal
        teammate = solving_proposal(agent, p and p[0], bool(p and p[3]))
        return teammate or self.room.solve(self.player, self.boxes) or ""

    def expert_program(self, bug: str | None = None) -> str:
        return sokoban_program(self.room.render(self.player, self.boxes), bug)

    def answer_alphabet(self) -> str:
        return "UDLR"

    # ---- prompts --------------------------------------------------------------------------------------
    def _compact(self, agent: str) -> str:
        """Fixed-format text for tiny policies: header, room, the tool's proposal (planner only), '>'."""
        head = (f"{agent[0].upper()}{self.turn} A{self.player[0]},{self.player[1]} B{_fmt(self.boxes)} "
                f"G{_fmt(tuple(sorted(self.room.goals)))}")
        lines = [head, self.room.render(self.player, self.boxes)]
        if agent == "plan" and "tool" in self.agents:
            if self.proposal is None:
                lines.append("T:?" + self._program_mark())
            else:
                moves, player, boxes, solved = self.proposal
                mark = "+" if solved else "-"
                lines.append(f"T:{moves[:PROPOSAL_SHOWN]}@A{player[0]},{player[1]} B{_fmt(boxes)}{mark}")
        elif agent == "tool" and self._program_mark():
            lines.append(self._program_mark().strip())
        return "\n".join(lines) + "\n>"

    def _chat(self, agent: str) -> Messages:
        rules = (
            f"You are the {'tool agent' if agent == 'tool' else 'plan agent'} of a team solving a Sokoban puzzle "
            f"on a {self.size}x{self.size} grid. Cells: '#' wall, '.' floor, '_' goal, 'B' box, '*' box on a goal, "
            "'A' you, '+' you standing on a goal. Moves: U (row-1), D (row+1), L (col-1), R (col+1). Moving into "
            "a box pushes it one cell if the cell behind it is free floor; you cannot pull boxes, and a move into "
            "a wall or into a box that cannot move leaves everything in place. The puzzle is solved when every "
            "box is on a goal. A box pushed into a corner that is not a goal can never move out. Rows and columns "
            "count from 0.")
        fmt = "Think briefly, then end with your answer as a list on the last line, e.g. [R, R, D, L]."
        if agent == "tool" and self.tool_mode == "code":
            task, fmt = self._tool_task("finds a move list that solves the puzzle (a search over player and box "
                                        "positions, say)", "RRDL or [R, R, D, L]"), ""
        elif agent == "tool":
            task = ("Propose a move list that solves the puzzle. Your proposal is simulated and shown to the plan "
                    "agent, who makes the real moves.")
        else:
            task = "Give the move list that is executed now, from the current position."
        body = [f"Turn {self.turn + 1} of {self.max_turns}.",
                f"You are at row {self.player[0]}, col {self.player[1]}. Boxes at (row, col): "
                f"{', '.join(f'({r}, {c})' for r, c in self.boxes)}. Goals at: "
                f"{', '.join(f'({r}, {c})' for r, c in sorted(self.room.goals))}.",
                "Grid:", self.room.render(self.player, self.boxes)]
        if self.history:
            body.append("Moves executed so far: " + " then ".join(self.history))
        body += self._program_report(agent)
        if self.proposal is not None and (agent == "plan" or self.tool_mode == "code"):
            moves, player, boxes, solved = self.proposal
            who, when = ("Tool agent", "the current state") if agent == "plan" else ("You", "the state back then")
            body.append(f"{who} proposed [{', '.join(moves)}]; simulated from {when} it ends with "
                        f"you at row {player[0]}, col {player[1]} and boxes at "
                        f"{', '.join(f'({r}, {c})' for r, c in boxes)} "
                        f"({'solves' if solved else 'does not solve'} the puzzle)."
                        + (" Its result:" if agent == "plan" else ""))
            if agent == "plan":  # the tool copies the grid into its program: show it one grid only
                body.append(self.room.render(player, boxes))
        return [{"role": "system", "content": f"{rules} {task} {fmt}".rstrip()},
                {"role": "user", "content": "\n".join(body)}]
