"""How a rollout samples: one settings object for every rollout, and the cut of a response at a stop string."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

# agent -> its own sampling settings (rollout.per_agent): any of temperature, max_new_tokens, stop (strings)
PerAgent = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of one rollout: ``K`` candidates per (turn, agent) node (tree) or ``K`` trajectories
    per problem (trajectory), drawn at ``temperature`` (0: greedy) with at most ``max_new_tokens`` tokens, each
    scored ``alpha * team + local``; ``per_agent``: a role's own temperature / max_new_tokens / stop strings
    over these defaults (``rollout.per_agent``)."""

    K: int
    temperature: float
    max_new_tokens: int
    alpha: float = 1.0
    per_agent: PerAgent = field(default_factory=dict)

    def for_agent(self, agent: str) -> tuple[float, int, tuple[str, ...]]:
        """(temperature, max_new_tokens, stop strings) of ``agent``: its ``per_agent`` entry over the defaults."""
        own = (self.per_agent or {}).get(agent) or {}
        stop = own.get("stop") or ()
        return (float(own.get("temperature", self.temperature)), int(own.get("max_new_tokens", self.max_new_tokens)),
                (stop,) if isinstance(stop, str) else tuple(stop))


def cut_at_stop(completion, stop: Sequence[str], decode: Callable[[list[int]], str]):
    """The completion up to and including the first token that completes a stop string (a new ``Completion``
    marked finished: its ids, log-probs and text are that prefix), or ``completion`` unchanged when no stop
    string occurs. Log-probs of a prefix do not depend on what follows, so the stored ones stay exact."""
    if not stop or not any(t in completion.text for t in stop):
        return completion
    ids = completion.ids
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string (monotone in the prefix length)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(t in decode(ids[:mid]) for t in stop):
            hi = mid
        else:
            lo = mid + 1
    return dataclasses.replace(completion, ids=list(ids[:lo]), logprobs=list(completion.logprobs[:lo]),
                               text=decode(ids[:lo]), finished=True)
