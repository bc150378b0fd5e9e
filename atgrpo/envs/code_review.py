"""Code with a reviewer: coder, unit tester and reviewer, a three-role team whose turn order is not fixed.

Roles: ``coder`` and ``tester`` act as in ``code`` (``code.CodeEnv``: a stdin/stdout program judged on hidden
tests; test cases judged against the reference solution). The ``reviewer`` then reads the problem, the coder's
program and its results on the tester's cases, and answers ``APPROVE`` or ``REVISE: <reason>``:
- APPROVE ends the episode: the coder's program is final. Neither a correct program nor the team's agreement
  ends it any more (the reviewer does), so the reviewer judges correct programs as well as wrong ones.
- REVISE sends the turn back to the coder (a new turn: a turn is one pass through the agents in order), with
  the reason shown in the coder's and tester's next prompts. After ``max_turns`` turns the episode truncates.
- Anything else is no decision: a format penalty, and the turn goes back to the coder as for REVISE.

Rewards: coder and tester as in ``code``; the reviewer's ``local`` = 1.0 for a right decision (approve a
program that passes every hidden test, ask to revise one that does not), 0.0 for a wrong one, minus
``REVIEW_PENALTY`` for no decision; ``team`` = the hidden-test pass ratio of the coder's program, for every
role. Success: the final program passes every hidden test.

Why a reviewer: software-engineering agent teams (ChatDev's and MetaGPT's code review, AgentCoder's
programmer / test designer / test executor) put a role between writing and shipping code that judges whether
the work is done; here it decides when the episode ends, from the program and the tester's evidence, without
the hidden tests. Compact prompts add ``V:revise`` after a revision request; the reviewer answers ``approve`` or
``revise``.
"""

from __future__ import annotations

from typing import Any

from .base import Messages
from .code import SHOW_CODE_CHARS, CodeEnv
from .verdicts import JudgedTeam

VERDICTS = {"approve": "approve", "revise": "revise"}
REVIEW_PENALTY = 0.1


class CodeReviewEnv(JudgedTeam, CodeEnv):
    """Code, three roles: coder + unit tester + reviewer (APPROVE ends the episode, REVISE sends it back)."""

    name = "code_review"
    team_roles = ("coder", "tester", "reviewer")
    single_agent_roles = ("coder",)
    judge, answerer, verdicts = "reviewer", "coder", VERDICTS
    accept, no_verdict, flip_to, verdict_penalty = "approve", "revise", "revise", REVIEW_PENALTY

    def _reset(self, seed: int) -> None:
        super()._reset(seed)
        self.problem_id = self.problem_id.replace("code/", "code_review/", 1)

    def _judgement(self) -> tuple[bool, float, dict[str, Any]]:
        """The program passes every hidden test; team reward its hidden-test pass ratio."""
        return self.hidden_pass == 1.0, self.hidden_pass, {"pass_ratio": self.hidden_pass}

    def _expert_verdict(self) -> str:
        """Approve a program that passes the hidden tests, else ask for a revision."""
        return "approve" if self.hidden_pass == 1.0 else "revise"

    def _verdict_text(self, verdict: str) -> str:
        if self.style == "compact":
            return verdict
        return "APPROVE" if verdict == "approve" else "REVISE: the program fails some of the test cases."

    # ---- prompts ----------------------------------------------------------------------------------------
    def _compact(self, agent: str) -> str:
        text = super()._compact(agent)
        return text if self.verdict != "revise" else text[:-2] + "\nV:revise\n>"

    def _chat(self, agent: str) -> Messages:
        if len(self.agents) == 1:
            return super()._chat(agent)
        if agent != "reviewer":
            msgs = super()._chat(agent)
            msgs[0]["content"] = msgs[0]["content"].replace(
                "a two-agent team (a coder and a unit tester)", "a three-agent team (a coder, a unit tester and a "
                "reviewer who decides when the program is done)")
            if self.verdict == "revise":
                msgs[1]["content"] += ("\n\nThe reviewer asked for a revision" +
                                       (f": {self.reason}" if self.reason else "."))
            return msgs
        role = ("You are the reviewer in a three-agent team (a coder, a unit tester and you) solving a programming "
                "problem. Decide whether the coder's current program is correct: it will be judged on hidden "
                "tests. Use the problem statement, the program and its results on the tester's cases (the cases "
                "can be wrong). Reply APPROVE if the program is correct and complete; otherwise reply "
                "REVISE: <what is wrong>, which sends it back to the coder.")
        p = self.problem
        statement = f"```python\n{p.statement.strip()}\n```" if p.function_mode else p.statement.strip()
        body = [f"Turn {self.turn + 1} of {self.max_turns}.", "", "Problem:", statement, "",
                "The coder's current program:",
                "```python\n" + (self.code or "")[:SHOW_CODE_CHARS].rstrip() + "\n```"]
        if self.feedback is not None:
            body += ["", self._feedback_text("tester").replace("previous program", "current program")]
        return [{"role": "system", "content": role}, {"role": "user", "content": "\n".join(body)}]
