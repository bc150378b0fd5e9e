"""The turn-based multi-agent environment API.

In the spirit of PettingZoo's AEC API, because the agents of a MAS act in turn: ``reset(seed)``, the acting
agent (``current_agent``), ``observe(agent, style)``, ``step(text)`` for the acting agent, plus ``clone()``,
which tree sampling needs to score K candidates from one pre-state on K independent copies.

Differences from PettingZoo: actions are raw model text, parsed by the environment (a parse failure is data:
a format penalty and ``info["parse_error"]``, never an exception); rewards come as two terms, ``team`` and
``local`` (the trainer combines them as ``alpha * team + local``); an environment instance is one problem.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from typing import Any

PROMPT_STYLES = ("compact", "chat")

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Reward:
    """The two reward terms of one agent step (docs/method.md): shared team outcome and role-local score."""

    team: float
    local: float

    def total(self, alpha: float) -> float:
        return alpha * self.team + self.local


@dataclass
class StepResult:
    """What one ``step`` returns: the acting agent's reward and the episode flags after the step."""

    agent: str
    reward: Reward
    terminated: bool  # the task ended (solved or failed for good)
    truncated: bool  # the turn limit was reached
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class MultiAgentEnv:
    """Base class of all atgrpo environments. One instance holds one problem.

    Subclasses set ``team_roles`` (the roles in turn order) and ``single_agent_roles``, pass the caller's
    ``roles`` to ``__init__`` (which checks them and sets ``agents``), and implement ``_reset``, ``_observe``,
    ``_apply`` and ``success``. The base class runs the turn order: by default agents act in order ``agents[0],
    agents[1], ...`` (round-robin); an environment may choose the next agent from its state instead
    (``_next_agent``: send the turn back, let an agent pass). A turn is one pass through the agents in order:
    the turn counter advances whenever the next agent does not come later in ``agents`` than the one that just
    acted (so no agent acts twice in one turn, and (problem, turn, agent) names one node); the episode truncates
    after ``max_turns`` turns.
    """

    name: str = "base"
    agents: tuple[str, ...] = ()  # the roles of this instance, in turn order
    team_roles: tuple[str, ...] = ()  # the multi-agent roles, in turn order
    single_agent_roles: tuple[str, ...] = ()  # the roles of the single-agent (L0) variant: pass as roles=

    def __init__(self, max_turns: int, style: str = "compact", roles: tuple[str, ...] | None = None):
        """``roles``: ``team_roles`` (the default) or ``single_agent_roles``."""
        roles = self.team_roles if roles is None else tuple(roles)
        allowed = [r for r in (self.team_roles, self.single_agent_roles) if r]
        if allowed and roles not in allowed:
            raise ValueError(f"{self.name} roles must be {' or '.join(map(repr, allowed))}, got {roles!r}")
        self.agents = roles
        if style not in PROMPT_STYLES:
            raise ValueError(f"unknown prompt style {style!r}; valid: {', '.join(PROMPT_STYLES)}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.style = style
        self.turn = 0
        self._agent_idx = 0
        self.terminated = False
        self.truncated = False
        self.problem_id: str = ""

    # ---- public API -------------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        """Start a new episode on the problem generated from ``seed``."""
        self.turn = 0
        self._agent_idx = 0
        self.terminated = False
        self.truncated = False
        self._reset(seed)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def current_agent(self) -> str | None:
        """The agent that acts next, or None once the episode is over."""
        return None if self.done else self.agents[self._agent_idx]

    def observe(self, agent: str | None = None, style: str | None = None) -> str | Messages:
        """The prompt for ``agent`` (default: the acting one): a string (compact) or chat messages (chat)."""
        agent = agent or self.current_agent
        if agent not in self.agents:
            raise ValueError(f"unknown agent {agent!r}; agents of {self.name}: {', '.join(self.agents)}")
        return self._observe(agent, style or self.style)

    def step(self, text: str) -> StepResult:
        """Apply the acting agent's raw output. Never raises on bad text: it is scored with a format penalty."""
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        agent = self.agents[self._agent_idx]
        reward, info = self._apply(agent, text if isinstance(text, str) else str(text))
        if not (math.isfinite(reward.team) and math.isfinite(reward.local)):
            raise AssertionError(f"{self.name}: non-finite reward {reward} for agent {agent}")
        if self.success or self._ends_early():
            self.terminated = True
        nxt = self._next_agent(agent)
        if nxt not in self.agents:
            raise AssertionError(f"{self.name}: _next_agent returned {nxt!r}, not one of {self.agents}")
        idx = self.agents.index(nxt)
        if idx <= self._agent_idx:  # back to an agent at or before this one: a new turn
            self.turn += 1
            if not self.terminated and self.turn >= self.max_turns:
                self.truncated = True
        self._agent_idx = idx
        info.setdefault("success", self.success)
        return StepResult(agent, reward, self.terminated, self.truncated, info)

    def clone(self) -> "MultiAgentEnv":
        """An independent copy: stepping it never changes this one."""
        return copy.deepcopy(self)

    # ---- for subclasses ---------------------------------------------------------------------------------
    @property
    def success(self) -> bool:
        raise NotImplementedError

    def _next_agent(self, agent: str) -> str:
        """The agent that acts after ``agent`` (called after its step was applied). Default: the next in turn
        order, round-robin. Override to choose from the state: e.g. a verifier that rejects an answer sends the
        turn back to the reasoner (a new turn), an agent with nothing to do is skipped."""
        return self.agents[(self.agents.index(agent) + 1) % len(self.agents)]

    def _ends_early(self) -> bool:
        """True when the episode ends now, before the turn limit, although the task is not solved (the step
        that made it true is marked ``terminated``). What ends an episode early is the task's own: in code
        and math, the agents agree (their answers match, right or wrong); in Sokoban, a box stands on a dead
        square, so the puzzle can no longer be solved. Default: never."""
        return False

    def _reset(self, seed: int) -> None:
        raise NotImplementedError

    def _observe(self, agent: str, style: str) -> str | Messages:
        raise NotImplementedError

    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        raise NotImplementedError

    def demo_action(self, agent: str, rng: random.Random, noise: float) -> str:
        """A noisy expert action for warm-start demonstrations: each character of the expert's answer is
        replaced, with probability ``noise``, by a random character of the environment's answer alphabet."""
        alphabet = self.answer_alphabet()
        return "".join(rng.choice(alphabet) if ch in alphabet and rng.random() < noise else ch
                       for ch in self.expert_action(agent))

    def answer_alphabet(self) -> str:
        """The characters that make up answers (used by ``demo_action``)."""
        raise NotImplementedError(f"{self.name} defines no answer alphabet")

    def expert_action(self, agent: str) -> str:
        """A scripted (optimal or strong) action text for ``agent`` in the current state: used for warm-start
        demonstrations and tests. Environments without an expert raise NotImplementedError."""
        raise NotImplementedError(f"{self.name} has no scripted expert")
