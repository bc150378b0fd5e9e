"""A team environment that only scripts turns: what ``atgrpo bench scale`` times its turns and agents axes on.

Why it exists: the scaling benchmark moves the number of turns (1 ... 8) and the size of the team (1 ... 4) one at
a time, and needs the rollout to run exactly that many (turn, agent) nodes. The registered tasks cannot: their
teams have two or three roles, and they end early (a solved grid, agreeing answers), so the number of turns
depends on what the policy wrote. ``ScriptedTurns`` has ``agents`` roles acting round-robin for exactly
``max_turns`` turns: a fixed reward (so every node's K candidates tie and the tree keeps branch 0), never
solved, never ended early. Its prompt is the problem text followed by the kept transcript (each earlier
agent's response), so prompts grow turn by turn as they do in the real tasks. It is not registered: it is no
task to train on.
"""

from __future__ import annotations

from typing import Any

from ..envs.base import MultiAgentEnv, Reward


def team_roles(agents: int) -> tuple[str, ...]:
    """The role names of a scripted team of ``agents``: agent_1, agent_2, ..."""
    return tuple(f"agent_{i + 1}" for i in range(agents))


class ScriptedTurns(MultiAgentEnv):
    """``agents`` roles in turn order for exactly ``max_turns`` turns on one problem text; reward team 0, local 0."""

    name = "scripted_turns"

    def __init__(self, problem: str, agents: int = 2, max_turns: int = 2, style: str = "compact"):
        if agents < 1:
            raise ValueError(f"agents must be >= 1, got {agents}")
        super().__init__(max_turns=max_turns, style=style, roles=team_roles(agents))
        self.problem = problem
        self.transcript: list[tuple[str, str]] = []  # (agent, its kept response), in order

    def _reset(self, seed: int) -> None:
        self.problem_id = f"{self.name}/{seed}"
        self.transcript = []

    @property
    def success(self) -> bool:
        return False

    def _observe(self, agent: str, style: str):
        history = "".join(f"\n{a}: {text}" for a, text in self.transcript)
        if style == "compact":
            return f"{self.problem}{history}\n{agent}:"
        return [{"role": "user", "content": f"{self.problem}{history}\nYou are {agent}."}]

    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        self.transcript.append((agent, text))
        return Reward(team=0.0, local=0.0), {"parse_error": False}
