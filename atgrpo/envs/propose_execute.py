"""The step shared by the games (Plan-Path, Sokoban, Sudoku): the tool proposes, the plan executes.

Each game's team is ``tool`` then ``plan`` (``roles=("plan",)``: the single-agent variant). Both agents answer
with the same kind of action (a move list, a Sudoku grid or fills), read and scored the same way; only what
happens to the result differs: the tool's action is simulated on a copy of the state and kept as the
``proposal`` that both agents' next prompts show (the real state does not move), the plan's action is executed
on the real state. Scoring one code path for both roles is what makes a proposal's simulated reward the reward
its execution would get.

``ProposeExecuteGame._apply`` runs that flow once for all games; a game supplies only what differs: how an
action is parsed (``_parse``), simulated and scored (``_simulate``), kept as a proposal (``_proposal``) and
executed (``_execute``).
"""

from __future__ import annotations

from typing import Any

from .base import Messages, MultiAgentEnv, Reward
from .programs import has_python_block
from .tool_code import ToolCodeMixin


class ProposeExecuteGame(ToolCodeMixin, MultiAgentEnv):
    """A two-role game (``tool`` proposes, ``plan`` executes) with the tool's code mode (``ToolCodeMixin``).

    One step (``_apply``): the tool's text goes through ``_read_tool`` (in code mode: its program's last printed
    line), then ``_parse``. A plan answer holding a python code block is the tool's kind of answer, not an
    action: it scores ``format_penalty`` and moves nothing (the parsers would otherwise read a grid or moves out of
    the program's text, a free no-op that let a small shared model drift into writing programs in both roles).
    Nothing readable scores ``format_penalty`` (team 0) and, for the tool, clears the
    proposal. Otherwise ``_simulate`` scores the action on a copy of the state; a partly readable answer adds
    ``format_penalty`` to that score; the tool's result becomes ``proposal`` (``_proposal``), the plan's is
    executed (``_execute``). ``team`` = 1.0 when the real task is solved after the step, else 0.0. ``info``:
    ``parse_error``, the game's parse fields, the program-run fields (code mode, tool), then the simulation's
    stats.

    Subclasses also implement ``_compact`` and ``_chat`` (the two prompt styles) and the ``MultiAgentEnv`` and
    ``ToolCodeMixin`` hooks (``_reset``, ``success``, ``expert_program``, ...).
    """

    team_roles = ("tool", "plan")
    single_agent_roles = ("plan",)
    format_penalty: float = -1.0  # each game sets its own FORMAT_PENALTY

    # ---- what each game supplies ----------------------------------------------------------------------
    def _parse(self, text: str) -> tuple[Any | None, bool, dict[str, Any]]:
        """(action, ok, info fields): the action read from ``text`` (None when nothing readable), ``ok`` False
        when some of the text could not be read, and the fields that describe the parse (e.g. the moves)."""
        raise NotImplementedError

    def _simulate(self, action: Any) -> tuple[Any, float, dict[str, Any]]:
        """Score ``action`` from the real state without changing it: (the state it leads to, the local reward
        without format penalty, stats for ``info``)."""
        raise NotImplementedError

    def _proposal(self, action: Any, outcome: Any, stats: dict[str, Any]) -> Any:
        """What the tool's simulated ``action`` is kept as (``self.proposal``, shown in the prompts)."""
        raise NotImplementedError

    def _execute(self, action: Any, outcome: Any) -> None:
        """Make the plan's ``action`` real: the state becomes its simulated ``outcome``."""
        raise NotImplementedError

    # ---- the common flow ------------------------------------------------------------------------------
    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        if agent != "tool" and has_python_block(text):  # the plan's answer is an action, never a program
            return Reward(team=0.0, local=self.format_penalty), {"parse_error": True, "plan_wrote_program": True}
        text, run = self._read_tool(agent, text)
        action, ok, parsed = self._parse(text)
        info: dict[str, Any] = {"parse_error": not ok, **parsed, **self._run_info(run, action is not None)}
        if action is None:
            if agent == "tool":
                self.proposal = None
            return Reward(team=0.0, local=self.format_penalty), info
        outcome, local, stats = self._simulate(action)
        info.update(stats)
        if not ok:
            local += self.format_penalty
        if agent == "tool":
            self.proposal = self._proposal(action, outcome, stats)
        else:
            self._execute(action, outcome)
        return Reward(team=1.0 if self.success else 0.0, local=local), info

    def _observe(self, agent: str, style: str) -> str | Messages:
        return self._compact(agent) if style == "compact" else self._chat(agent)

    def _compact(self, agent: str) -> str:
        """Fixed-format text for tiny policies."""
        raise NotImplementedError

    def _chat(self, agent: str) -> Messages:
        """Chat messages for pretrained models."""
        raise NotImplementedError
