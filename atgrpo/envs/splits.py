"""Train / evaluation splits that are disjoint by construction.

An instance belongs to the evaluation split iff a hash of its *content* (its fingerprint: the canonical text
of the puzzle) falls in the evaluation bucket. Generators draw instances from a seeded RNG and keep drawing
until the instance belongs to the requested split, so the same puzzle can never be both a training and an
evaluation problem, whatever seeds are used (unlike "seed modulo pool size" schemes, where two seeds can
produce one puzzle).
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable, TypeVar

SPLITS = ("train", "eval")
EVAL_FRACTION = 0.2
MAX_DRAWS = 10_000

T = TypeVar("T")


def split_of(fingerprint: str) -> str:
    """The split an instance belongs to, from its content alone."""
    h = int.from_bytes(hashlib.sha256(fingerprint.encode()).digest()[:8], "big")
    return "eval" if h / 2**64 < EVAL_FRACTION else "train"


def seeded_rng(namespace: str, seed: int) -> random.Random:
    """A private RNG for (environment, seed): reproducible and independent of global random state."""
    digest = hashlib.sha256(f"{namespace}:{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def draw(generate: Callable[[random.Random], T], fingerprint: Callable[[T], str], namespace: str, seed: int,
         split: str) -> T:
    """Draw the instance for ``seed`` in ``split``: the first generated instance whose content hash is in it."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    rng = seeded_rng(namespace, seed)
    for _ in range(MAX_DRAWS):
        inst = generate(rng)
        if split_of(fingerprint(inst)) == split:
            return inst
    raise RuntimeError(f"{namespace}: no {split} instance in {MAX_DRAWS} draws (generator too narrow?)")
