"""The games' tool agent as a programmer (``tool_mode="code"``), shared by Plan-Path, Sokoban and Sudoku.

In ``code`` mode, as in the paper, the tool agent does not type its proposal: it writes a Python program (the
last fenced python block of its answer, else the whole answer: ``programs.extract_code``, as in the math and
code tasks), which runs in ``atgrpo.sandbox`` with a time limit (``timeout``). The instance reaches the
program only through the prompt text (the program hard-codes the grid); atgrpo's source, and so the
environment's own solver, is hidden from the sandbox. The last non-empty stdout line is the proposal, parsed
and simulated on a copy exactly as a direct proposal is. A program that crashes, times out or prints nothing
readable scores the game's format penalty and leaves no proposal. Both agents' next prompts show the run: exit
status or timeout, stdout / stderr tails, and the simulated result of the printed proposal.

In ``direct`` mode the tool agent types the proposal itself (what a tiny byte-level policy can learn). Default:
``code`` with chat prompts (pretrained models), ``direct`` with compact prompts (the tiny policy).
"""

from __future__ import annotations

import random
import warnings
from typing import Any

from ..sandbox import isolation
from .expert_programs import BUGS
from .programs import ProgramRun, program_info, program_output, run_program

TOOL_MODES = ("code", "direct")
DEFAULT_TIMEOUT = 2.0  # seconds per tool program
PROGRAM_SHOWN = 1500  # characters of its own previous program shown to the tool agent (chat)


def resolve_tool_mode(tool_mode: str | None, style: str) -> str:
    """``tool_mode`` checked, or the style's default (chat: code, compact: direct)."""
    mode = tool_mode or ("code" if style == "chat" else "direct")
    if mode not in TOOL_MODES:
        raise ValueError(f"unknown tool_mode {mode!r}; valid: {', '.join(TOOL_MODES)}")
    return mode


class ToolCodeMixin:
    """Code-mode plumbing for a two-role game (``tool``, ``plan``). The game calls ``_setup_tool`` in
    ``__init__``, sets ``tool_run = None`` in ``_reset``, passes the tool's text through ``_read_tool`` in
    ``_apply``, adds ``_program_report`` / ``_program_mark`` to its prompts and implements ``expert_program``."""

    tool_mode: str = "direct"
    timeout: float = DEFAULT_TIMEOUT
    tool_run: ProgramRun | None = None
    proposal: object | None = None  # the game's simulated tool proposal (None: the tool gave none)

    def _setup_tool(self, tool_mode: str | None, timeout: float, style: str) -> None:
        self.tool_mode = resolve_tool_mode(tool_mode, style)
        if not timeout > 0:
            raise ValueError(f"{self.name} timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        if self.tool_mode == "code" and "tool" in self.agents and not isolation().namespaces:
            warnings.warn(f"{self.name} tool_mode='code': the sandbox cannot isolate programs on this machine "
                          f"({isolation().reason}); tool programs are refused unless sandbox.unconfined: true, and "
                          "then they can import and read atgrpo, the environment's solver included",
                          RuntimeWarning, stacklevel=3)

    def _read_tool(self, agent: str, text: str) -> tuple[str, ProgramRun | None]:
        """The text the game parses: in code mode, for the tool, the last printed line of its program ('' when
        the program crashed, timed out or printed nothing); else the answer itself."""
        if agent != "tool" or self.tool_mode != "code":
            return text, None
        run = run_program(text, self.timeout)
        self.tool_run = run
        return run.answer or "", run

    @staticmethod
    def _run_info(run: ProgramRun | None, parsed: bool) -> dict[str, Any]:
        return {} if run is None else {**program_info(run, parsed), **program_output(run)}

    # ---- prompts --------------------------------------------------------------------------------------
    def _tool_task(self, goal: str, example: str) -> str:
        """The tool agent's instructions in code mode (chat)."""
        return (f"Write a Python program that {goal} and prints it as the last line of its output, e.g. "
                f"{example}. Put the program in a ```python code block. It runs with a {self.timeout:g} s time "
                "limit, without input, files or network, standard library only: copy the grid from this message "
                "into the program as a string. The printed answer is checked on a copy and shown to the plan "
                "agent, who makes the real move.")

    def _program_report(self, agent: str) -> list[str]:
        """Chat lines on the tool's latest program run (none before the first run)."""
        run = self.tool_run
        if run is None or self.tool_mode != "code":
            return []
        own = agent == "tool"
        who = "Your" if own else "The tool agent's"
        out = []
        if own:
            out.append(f"Your previous program:\n```python\n{run.code[-PROGRAM_SHOWN:].rstrip()}\n```")
        out.append(f"{who} program run: {run.status(self.timeout)}.")
        if run.stdout.strip():
            out.append(f"stdout (end):\n{run.stdout.rstrip()}")
        if run.stderr.strip():
            out.append(f"stderr (end):\n{run.stderr.rstrip()}")
        if run.crashed:
            out.append("It gave no proposal.")
        elif run.answer is None:
            out.append("It printed nothing, so it gave no proposal.")
        elif self.proposal is None:
            out.append(f"Its last printed line is no readable proposal: {run.answer[:200]}")
        else:
            out.append(f"Last printed line (the proposal): {run.answer[:200]}")
        return out

    def _program_mark(self) -> str:
        """Compact note on a tool program that gave no proposal (' E:NameError', ' E:timeout', ' E:empty',
        ' E:unreadable'), else ''."""
        run = self.tool_run
        if run is None or self.tool_mode != "code" or self.proposal is not None:
            return ""
        if run.crashed:
            return f" E:{run.error()}"
        return " E:empty" if run.answer is None else " E:unreadable"

    # ---- scripted expert ------------------------------------------------------------------------------
    def expert_program(self, bug: str | None = None) -> str:
        """The scripted tool agent's program for the current state (``expert_programs``)."""
        raise NotImplementedError

    def _wrap(self, program: str) -> str:
        return program if self.style == "compact" else f"```python\n{program}```"

    def demo_action(self, agent: str, rng: random.Random, noise: float) -> str:
        """Code mode, tool: the expert's program, with probability ``noise`` carrying one bug drawn from
        ``expert_programs.BUGS`` (a crash, no output, a wrong answer); otherwise the character noise of
        ``MultiAgentEnv.demo_action``."""
        if agent == "tool" and self.tool_mode == "code":
            bug = rng.choice(BUGS) if rng.random() < noise else None
            return self._wrap(self.expert_program(bug))
        return super().demo_action(agent, rng, noise)
