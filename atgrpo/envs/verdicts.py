"""Reading a judge's verdict: the first word(s) of its answer, then an optional reason.

The third roles of the three-agent teams judge the others' work: math's verifier (``ACCEPT`` / ``REJECT`` /
``REJECT TOOL``), code's reviewer (``APPROVE`` / ``REVISE``). Either answers with a verdict word, optionally a
colon and a reason (shown to the agent it sends the turn back to); anything else is no verdict.
"""

from __future__ import annotations

import re

REASON_CHARS = 300  # of a reason, kept and shown


def read_verdict(text: str, words: dict[str, str]) -> tuple[str | None, str]:
    """(the verdict ``words[w]`` for the word(s) ``w`` that ``text`` starts with, case and spacing aside, or None;
    the reason after it, at most ``REASON_CHARS``). Longer words are tried first (``REJECT TOOL`` before
    ``REJECT``)."""
    alts = "|".join(r"\s+".join(map(re.escape, w.split())) for w in sorted(words, key=len, reverse=True))
    m = re.match(rf"\s*({alts})\b\s*:?\s*(.*)", text or "", re.IGNORECASE | re.DOTALL)
    if not m:
        return None, ""
    return words[" ".join(m.group(1).lower().split())], m.group(2).strip()[:REASON_CHARS]
