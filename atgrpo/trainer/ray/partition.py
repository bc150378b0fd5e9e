"""Pure helpers shared by the Ray driver and workers (no torch, no ray)."""

from __future__ import annotations


def split_even(items: list, n: int) -> list[list]:
    """``items`` in ``n`` contiguous, nearly equal parts, the first ones one longer when ``n`` does not divide
    ``len(items)`` (some empty when there are fewer items than parts). The driver gives each environment worker
    one part of a node's problems; ``RemotePolicy`` each rollout worker one part of the prompts."""
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + q + (i < r)
        out.append(items[start:end])
        start = end
    return out
