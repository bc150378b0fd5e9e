"""The environment registry: names -> factories, and ``check_env``, the contract every environment passes.

Register a new environment with ``register("my_task", MyEnv)``; ``make("my_task", **kwargs)`` builds it.
"""

from __future__ import annotations

import random
from typing import Callable

from .base import PROMPT_STYLES, MultiAgentEnv, StepResult

_REGISTRY: dict[str, Callable[..., MultiAgentEnv]] = {}
_DESCRIPTIONS: dict[str, str] = {}


def register(name: str, factory: Callable[..., MultiAgentEnv], description: str = "") -> None:
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory
    _DESCRIPTIONS[name] = description or (factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else description


def make(name: str, **kwargs) -> MultiAgentEnv:
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


def registered() -> dict[str, str]:
    """Registered names and one-line descriptions."""
    return dict(sorted(_DESCRIPTIONS.items()))


JUNK_ACTIONS = ["", "   ", "\x00\xff\x10garbage", "[", "]]]", "[U, R", "x" * 100_000, "UUUU" * 5000,
                "[[1, 2], [3]]", "```python\nprint('hi')\n```", "\\boxed{}", "None", "[\"U\", 5, null]"]


def check_env(env: MultiAgentEnv, seed: int = 0, episodes: int = 3) -> None:
    """Assert the environment contract; raise AssertionError naming what broke.

    Checks: reset is deterministic per seed; prompts in every style are non-empty; step accepts any text
    (including junk) without raising and returns finite rewards; clone() is independent; episodes end within
    ``max_turns`` turns; observe() does not change the state.
    """
    rng = random.Random(seed)
    for ep in range(episodes):
        s = seed + ep
        env.reset(s)
        a = env.clone()
        env.reset(s)
        for style in PROMPT_STYLES:
            p1, p2 = env.observe(style=style), a.observe(style=style)
            assert p1 == p2, f"{env.name}: reset({s}) is not deterministic ({style} prompts differ)"
            assert p1, f"{env.name}: empty {style} prompt"
            if style == "chat":
                assert isinstance(p1, list) and all({"role", "content"} <= set(m) for m in p1), \
                    f"{env.name}: chat prompt must be a list of {{role, content}} messages"
            else:
                assert isinstance(p1, str), f"{env.name}: compact prompt must be a string"
        steps = 0
        while not env.done:
            agent = env.current_agent
            assert agent in env.agents, f"{env.name}: current_agent {agent!r} not in agents"
            before = env.observe()
            twin = env.clone()
            action = rng.choice(JUNK_ACTIONS) if rng.random() < 0.5 else _expert_or_junk(env, agent, rng)
            res = env.step(action)
            assert isinstance(res, StepResult) and res.agent == agent, f"{env.name}: bad StepResult {res!r}"
            assert twin.observe() == before, f"{env.name}: stepping the original changed its clone"
            steps += 1
            assert steps <= env.max_turns * len(env.agents), f"{env.name}: episode ran past max_turns"
        try:
            env.step("x")
        except RuntimeError:
            pass
        else:
            raise AssertionError(f"{env.name}: step() after the end must raise RuntimeError")


def _expert_or_junk(env: MultiAgentEnv, agent: str, rng: random.Random) -> str:
    try:
        return env.expert_action(agent)
    except NotImplementedError:
        return rng.choice(JUNK_ACTIONS)
