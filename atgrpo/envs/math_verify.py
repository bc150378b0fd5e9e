"""Math with a verifier: tool agent, reasoner and verifier, a three-role team whose turn order is not fixed.

Roles: ``tool`` and ``reasoner`` act as in ``math`` (``math_env.MathEnv``: a program's last printed line; a
``\\boxed{}`` answer). The ``verifier`` then checks the reasoner's answer against the tool's output and the
problem, and answers ``ACCEPT`` or ``REJECT: <reason>`` (``REJECT TOOL: <reason>`` when the program is at fault):
- ACCEPT ends the episode: the reasoner's answer is final. Agreement alone no longer ends it (the verifier does).
- REJECT sends the turn back to the reasoner, REJECT TOOL to the tool, with the reason shown in their next
  prompts. Either starts a new turn (a turn is one pass through the agents in order), so a rejected answer
  costs a turn: after ``max_turns`` the episode truncates with the reasoner's latest answer.
- Anything else is no decision: a format penalty, and the turn goes back to the reasoner as for REJECT.
So a turn is tool -> reasoner -> verifier, or reasoner -> verifier after a plain rejection.

Rewards: tool and reasoner as in ``math``; the verifier's ``local`` = 1.0 for a right decision (accept a correct
answer, reject a wrong one), 0.0 for a wrong one, minus ``FORMAT_PENALTY`` for no decision; ``team`` = the
reasoner's latest answer is correct, for every role. Success: the reasoner's final answer is correct.

Compact prompts add the verifier's last verdict (``V:accept``, ``V:reject``, ``V:reject-tool``) and the verifier
answers ``accept`` / ``reject`` / ``reject tool``; chat prompts show the verdict and the reason in words. Why a
verifier: the "solver + verifier" and "generate then critique" loops of multi-agent math (e.g. multi-agent
debate and self-verification work) add a role whose skill is judging, not solving, which a tiny reasoner that
copies a tool's output needs to have checked.
"""

from __future__ import annotations

from typing import Any

from .base import Messages
from .math_env import FORMAT_PENALTY, MathEnv
from .verdicts import JudgedTeam, read_verdict

VERDICTS = {"accept": "accept", "reject": "reject", "reject tool": "reject-tool"}


def read_decision(text: str) -> tuple[str | None, str]:
    """(``accept`` | ``reject`` | ``reject-tool`` | None, the reason): the first word(s) of ``text``."""
    return read_verdict(text, VERDICTS)


class MathVerifyEnv(JudgedTeam, MathEnv):
    """Math, three roles: tool agent (Python) + reasoner (\\boxed{}) + verifier (ACCEPT / REJECT, sends back)."""

    name = "math_verify"
    team_roles = ("tool", "reasoner", "verifier")
    single_agent_roles = ("reasoner",)
    judge, answerer, verdicts = "verifier", "reasoner", VERDICTS
    accept, no_verdict, flip_to, verdict_penalty = "accept", "reject", "reject", FORMAT_PENALTY

    def _reset(self, seed: int) -> None:
        super()._reset(seed)
        self.problem_id = self.problem_id.replace("math/", "math_verify/", 1)

    def _next_agent(self, agent: str) -> str:
        if agent == "verifier":
            return "tool" if self.verdict == "reject-tool" else "reasoner"
        return super()._next_agent(agent)

    def _judgement(self) -> tuple[bool, float, dict[str, Any]]:
        """The reasoner's latest answer is correct; team reward 1 if so."""
        answer = self.last.get("reasoner")
        correct = answer is not None and answer.correct
        return correct, 1.0 if correct else 0.0, {"correct": correct}

    def _expert_verdict(self) -> str:
        """Accept a correct answer; else reject the tool when its answer is wrong too, the reasoner otherwise."""
        answer, tool = self.last.get("reasoner"), self.last.get("tool")
        if answer is not None and answer.correct:
            return "accept"
        return "reject-tool" if tool is None or not tool.correct else "reject"

    def _verdict_text(self, verdict: str) -> str:
        if self.style == "compact":
            return verdict.replace("-", " ")
        return {"accept": "ACCEPT", "reject": "REJECT: the answer does not match the program's output.",
                "reject-tool": "REJECT TOOL: the program does not compute the problem's answer."}[verdict]

    # ---- prompts ----------------------------------------------------------------------------------------
    def _compact(self, agent: str) -> str:
        """``math``'s compact prompt plus the latest verdict: ``V1 Q:12+7*3=? T:33 R:33 V:reject\\n>``."""
        text = super()._compact(agent)
        if self.verdict is None:
            return text
        return text[:-2] + f" V:{self.verdict}\n>"

    def _chat(self, agent: str) -> Messages:
        if len(self.agents) == 1:
            return super()._chat(agent)
        if agent != "verifier":
            msgs = super()._chat(agent)
            msgs[0]["content"] = msgs[0]["content"].replace("a two-agent team", "a three-agent team (tool agent, "
                                                            "reasoning agent, verifier)")
            if self.verdict is not None and self.verdict != "accept":
                whose = "the tool agent's program" if self.verdict == "reject-tool" else "the reasoning agent's answer"
                msgs[1]["content"] += (f"\n\nThe verifier rejected {whose}"
                                       + (f": {self.reason}" if self.reason else ".") + " Try again.")
            return msgs
        task = ("You are the verifier of a three-agent team (tool agent, reasoning agent, verifier) solving a math "
                "problem. Check the reasoning agent's answer against the tool agent's program output and the "
                "problem. Reply ACCEPT if it is correct. Otherwise reply REJECT: <one-sentence reason> to send it "
                "back to the reasoning agent, or REJECT TOOL: <reason> if the program itself is wrong.")
        body = [f"Problem:\n{self.problem.question}", f"Turn {self.turn + 1} of {self.max_turns}."]
        tool, reasoner = self.last.get("tool"), self.last.get("reasoner")
        if tool is not None:
            body.append(self._tool_report(tool, own=False))
        shown = reasoner.answer if reasoner is not None and reasoner.answer is not None else "none"
        if reasoner is not None:
            body.append(f"The reasoning agent's solution (end):\n{reasoner.text[-1500:]}")
        body.append(f"The reasoning agent's answer: {shown}")
        return [{"role": "system", "content": task}, {"role": "user", "content": "\n\n".join(body)}]
