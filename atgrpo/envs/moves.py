"""Parsing of move lists (U/D/L/R) from free model text, shared by the grid games.

Accepted forms: a compact string ``RRDL``; letters or words separated by anything (``U, R, down``); a
bracketed list (``[U, R]``, ``["up", "right"]``), in which case the *last* bracketed list in the text is used,
else the last non-empty line (chat models reason first and answer last). Anything else is a parse failure, reported, never raised.
"""

from __future__ import annotations

import re

DELTAS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
PROPOSAL_SHOWN = 40  # moves of the tool's proposal shown to the plan agent in compact prompts
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R", "U": "U", "D": "D", "L": "L", "R": "R"}
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_TOKENS = re.compile(r"[A-Za-z]+")


def solving_proposal(agent: str, moves: str | None, solved: bool) -> str | None:
    """What the scripted plan agent does with the tool's proposal: execute it when its simulation solved the
    task and the compact prompt shows it whole (a teammate's solution is used, not re-derived); else None."""
    if agent == "plan" and moves and solved and len(moves) <= PROPOSAL_SHOWN:
        return moves
    return None


def parse_moves(text: str, max_moves: int) -> tuple[list[str], bool]:
    """Return (moves, ok). ``ok`` is False when no move could be read or the text holds non-move words in the
    answer part. At most ``max_moves`` moves are kept (longer lists are cut, with ok False)."""
    text = text[:20_000]
    lists = _BRACKETS.findall(text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    body = lists[-1] if lists else (lines[-1] if lines else "")
    moves: list[str] = []
    ok = True
    for tok in _TOKENS.findall(body):
        up = tok.upper()
        if up in _WORDS:
            moves.append(_WORDS[up])
        elif set(up) <= set("UDLR"):
            moves.extend(up)
        else:
            ok = False
    if len(moves) > max_moves:
        moves, ok = moves[:max_moves], False
    return moves, ok and bool(moves)
