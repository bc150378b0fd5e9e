"""Teams with a judge: a role that judges the others' work and decides when the episode ends.

The third roles of the three-agent teams judge: math's verifier (``ACCEPT`` / ``REJECT`` / ``REJECT TOOL``),
code's reviewer (``APPROVE`` / ``REVISE``). Either answers with a verdict word, optionally a colon and a reason
(shown to the agent it sends the turn back to); anything else is no verdict (``read_verdict``). ``JudgedTeam``
holds the rules both share: only the judge's acceptance ends a team episode (not the task's own early end, not
a correct answer alone); the judge's local reward is 1 for a right decision, 0 for a wrong one, minus a penalty
for none; its demonstrations flip the expert's decision with probability ``noise``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from .base import Reward

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


class JudgedTeam:
    """Mixin, before the task's environment in the bases (``class MathVerifyEnv(JudgedTeam, MathEnv)``), for a
    team whose role ``judge`` ends the episode with the verdict ``accept``. With one agent (the single-agent
    variant) the task's own rules apply unchanged.

    A subclass sets ``judge``, ``answerer`` (whose new answer clears the verdict), ``verdicts`` (words ->
    verdict), ``accept``, ``no_verdict`` (what no verdict counts as), ``flip_to`` (what a flipped acceptance
    becomes in demonstrations) and ``verdict_penalty``, and implements ``_judgement`` (is the work correct, the
    team reward, info fields), ``_expert_verdict`` and ``_verdict_text``."""

    judge: str
    answerer: str
    verdicts: dict[str, str]
    accept: str
    no_verdict: str
    flip_to: str
    verdict_penalty: float

    def _judgement(self) -> tuple[bool, float, dict[str, Any]]:
        raise NotImplementedError

    def _expert_verdict(self) -> str:
        raise NotImplementedError

    def _verdict_text(self, verdict: str) -> str:
        raise NotImplementedError

    def _reset(self, seed: int) -> None:
        super()._reset(seed)
        self.verdict: str | None = None  # the judge's latest verdict
        self.reason = ""

    @property
    def success(self) -> bool:
        """The work is correct once the episode is over (only the judge, or the turn limit, ends it)."""
        return super().success if len(self.agents) == 1 else self.done and self._judgement()[0]

    def _ends_early(self) -> bool:
        return self.verdict == self.accept if len(self.agents) > 1 else super()._ends_early()

    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        if agent != self.judge:
            if agent == self.answerer:
                self.verdict = None  # a new answer awaits a new verdict
            reward, info = super()._apply(agent, text)
            self.agreed = False  # the team's agreement no longer ends the episode: the judge does
            return reward, info
        verdict, self.reason = read_verdict(text, self.verdicts)
        self.verdict = verdict or self.no_verdict
        correct, team, fields = self._judgement()
        right = verdict is not None and (verdict == self.accept) == correct
        local = (1.0 if right else 0.0) - (self.verdict_penalty if verdict is None else 0.0)
        info = {"decision": verdict, "parse_error": verdict is None, "right_decision": right, **fields}
        return Reward(team=team, local=local), info

    def expert_action(self, agent: str) -> str:
        if agent != self.judge:
            return super().expert_action(agent)
        return self._verdict_text(self._expert_verdict())

    def demo_action(self, agent: str, rng: random.Random, noise: float) -> str:
        """The judge's demonstration flips the expert's decision with probability ``noise``."""
        if agent != self.judge:
            return super().demo_action(agent, rng, noise)
        verdict = self._expert_verdict()
        if rng.random() < noise:
            verdict = self.flip_to if verdict == self.accept else self.accept
        return self._verdict_text(verdict)
