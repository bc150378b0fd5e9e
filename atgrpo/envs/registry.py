"""The environment registry: names -> factories, and ``check_env``, the contract every environment passes.

Register a new environment with ``register("my_task", MyEnv)``; ``make("my_task", **kwargs)`` builds it.
Environments outside atgrpo are found without registering them in this process, as Gymnasium's ``make`` does:

- ``make("my_pkg.my_module:MyEnv")`` imports ``my_pkg.my_module`` and takes its attribute ``MyEnv`` (a class or
  any factory returning a ``MultiAgentEnv``);
- a package that declares ``[project.entry-points."atgrpo.envs"] my_task = "my_pkg.my_module:MyEnv"`` makes
  ``make("my_task")`` work once it is installed.

An environment found either way passes ``check_env`` the first time it is built in a process (with the kwargs
of that first build); a failure raises ``EnvError`` naming the environment and what broke.
"""

from __future__ import annotations

import importlib
import random
from typing import Callable

from .base import PROMPT_STYLES, MultiAgentEnv, StepResult

_REGISTRY: dict[str, Callable[..., MultiAgentEnv]] = {}
_DESCRIPTIONS: dict[str, str] = {}
_CHECKED: set[str] = set()  # environments from outside atgrpo that passed check_env in this process
ENTRY_POINT_GROUP = "atgrpo.envs"


class EnvError(ValueError):
    """An environment name that does not resolve, or a user environment that fails ``check_env``."""


def register(name: str, factory: Callable[..., MultiAgentEnv], description: str = "") -> None:
    if _REGISTRY.get(name) is factory:  # the same module imported again (e.g. by module:attr): nothing to do
        return
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory
    _DESCRIPTIONS[name] = description or _first_doc_line(factory)


def _first_doc_line(factory) -> str:
    lines = (getattr(factory, "__doc__", None) or "").strip().splitlines()
    return lines[0] if lines else ""


def _entry_points() -> dict:
    """The ``atgrpo.envs`` entry points of the installed distributions, by name (nothing is imported)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _import_attr(spec: str) -> Callable[..., MultiAgentEnv]:
    """``package.module:Attr`` (``Attr`` may be dotted) -> the object; every failure is one ``EnvError``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise EnvError(f"environment {spec!r}: give module:Attr, e.g. my_pkg.my_env:MyEnv")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = f"module {e.name!r} is not found" if e.name else str(e)
        raise EnvError(f"environment {spec!r}: cannot import {module_name!r} ({missing}; is it installed or on "
                       f"PYTHONPATH?)") from None
    except Exception as e:
        raise EnvError(f"environment {spec!r}: importing {module_name!r} failed: {type(e).__name__}: "
                       f"{' '.join(str(e).split())}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvError(f"environment {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvError(f"environment {spec!r}: {attr!r} is not a class or a factory (got {type(obj).__name__})")
    return obj


def resolve(name: str) -> Callable[..., MultiAgentEnv]:
    """The factory of ``name``: a registered name, ``module:Attr``, or an ``atgrpo.envs`` entry point."""
    if not isinstance(name, str) or not name:
        raise EnvError(f"environment name {name!r} must be a non-empty string")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        return _import_attr(name)
    eps = _entry_points()
    if name in eps:
        try:
            return eps[name].load()
        except Exception as e:
            raise EnvError(f"environment {name!r} (entry point {eps[name].value!r} of group {ENTRY_POINT_GROUP!r}) "
                           f"does not load: {type(e).__name__}: {' '.join(str(e).split())}") from None
    known = sorted(set(_REGISTRY) | set(eps))
    raise EnvError(f"unknown environment {name!r}; registered: {', '.join(known)}; or give module:Class of your "
                   f"own (e.g. my_pkg.my_env:MyEnv), or register one under the {ENTRY_POINT_GROUP!r} entry-point "
                   f"group (docs/environments.md)")


def is_builtin(name: str) -> bool:
    """A name atgrpo registers itself (its environments are tested, not checked at run time)."""
    factory = _REGISTRY.get(name)
    return factory is not None and getattr(factory, "__module__", "").startswith("atgrpo.")


def make(name: str, **kwargs) -> MultiAgentEnv:
    factory = resolve(name)
    env = factory(**kwargs)
    if not isinstance(env, MultiAgentEnv):
        raise EnvError(f"environment {name!r} built a {type(env).__name__}, not an atgrpo.envs.MultiAgentEnv")
    if name not in _CHECKED and not is_builtin(name):
        try:
            check_env(factory(**kwargs))
        except AssertionError as e:
            raise EnvError(f"environment {name!r} fails check_env: {' '.join(str(e).split()) or 'AssertionError'}"
                           ) from None
        except Exception as e:
            raise EnvError(f"environment {name!r} fails check_env: {type(e).__name__}: {' '.join(str(e).split())}"
                           ) from None
        _CHECKED.add(name)
    return env


def registered() -> dict[str, str]:
    """Registered names and one-line descriptions, plus the ``atgrpo.envs`` entry points of installed packages
    (described by their target; they are imported only when used)."""
    out = dict(_DESCRIPTIONS)
    for name, ep in _entry_points().items():
        out.setdefault(name, f"(entry point {ep.value})")
    return dict(sorted(out.items()))


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
