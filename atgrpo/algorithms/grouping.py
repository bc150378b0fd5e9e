"""Group keys: which samples are compared with each other when computing advantages.

AT-GRPO groups by ``(problem, turn, agent)``: the K candidates of one tree node, which all saw the identical
prompt. The alternatives exist as baselines and ablations. Keys are explicit tuples, never integer arithmetic
on indices (docs/method.md, pitfall 2), and group sizes are checked.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Protocol, Sequence


class HasKeyFields(Protocol):
    problem: str
    turn: int
    agent: str


GROUP_KEYS: dict[str, Callable[[HasKeyFields], tuple]] = {
    "problem_turn_agent": lambda s: (s.problem, s.turn, s.agent),  # AT-GRPO
    "problem": lambda s: (s.problem,),  # trajectory-level (classic) GRPO
    "problem_agent": lambda s: (s.problem, s.agent),  # agent-wise only
    "problem_turn": lambda s: (s.problem, s.turn),  # turn-wise only
}


def group_key_fn(name: str) -> Callable[[HasKeyFields], tuple]:
    if name not in GROUP_KEYS:
        raise ValueError(f"unknown group key {name!r}; valid: {', '.join(GROUP_KEYS)}")
    return GROUP_KEYS[name]


def group_index(keys: Sequence[tuple]) -> tuple[list[int], list[tuple]]:
    """Dense group ids in order of first appearance: (ids per sample, the key of each id)."""
    ids: dict[tuple, int] = {}
    out = [ids.setdefault(k, len(ids)) for k in keys]
    return out, list(ids)


def check_group_sizes(keys: Sequence[tuple], expected: int) -> None:
    """Raise if any group does not have exactly ``expected`` members."""
    bad = {k: n for k, n in Counter(keys).items() if n != expected}
    if bad:
        k, n = next(iter(bad.items()))
        raise AssertionError(f"{len(bad)} groups do not have {expected} members, e.g. {k} has {n}")


def key_str(key: tuple) -> str:
    return "/".join(str(x) for x in key)
