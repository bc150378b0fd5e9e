"""What a run trains: the config, the environments, the agent -> policy map, the policies with their optimizers,
the loop's one random generator, and where the work runs (the backend); built from the config in one call."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import Config, ConfigError
from ..envs import MultiAgentEnv
from ..policies.protocol import TrainablePolicy
from .backend import Backend, LocalBackend
from .run_dir import one_line
from ..config.checks import route_agents
from .setup import build_policies, env_factory
from .update import make_optimizer


@dataclass
class TrainState:
    cfg: Config
    make_env: Callable[[str, int], MultiAgentEnv]
    agent_to_policy: dict[str, str]
    policies: dict[str, TrainablePolicy]
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator  # all sampling and shuffling randomness of the loop
    references: dict[str, TrainablePolicy] = field(default_factory=dict)  # frozen, for the KL penalty
    step: int = 0
    backend: Backend = field(default_factory=LocalBackend)  # where rollout, env steps and updates run


def seed_everything(seed: int) -> None:
    """Python's and torch's global generators (model initialisation); the loop draws from its own generator."""
    random.seed(seed)
    torch.manual_seed(seed)


def build_state(cfg: Config) -> TrainState:
    """The state of a fresh run of ``cfg`` (policies initialised from ``cfg.seed``, not yet warm-started)."""
    seed_everything(cfg.seed)
    make_env = env_factory(cfg)
    agents = make_env("train", 0).agents
    agent_to_policy = route_agents(cfg, agents)
    policies = build_policies(cfg, sorted(set(agent_to_policy.values())))
    optimizers = {pid: make_optimizer(p, cfg.algo) for pid, p in policies.items()}
    return TrainState(cfg, make_env, agent_to_policy, policies, optimizers, torch.Generator().manual_seed(cfg.seed),
                      backend=local_backend(cfg))


def local_backend(cfg: Config) -> LocalBackend:
    """The in-process backend; with bfloat16 precision on float32 weights it samples from bfloat16 copies."""
    from ..policies.precision import autocast_of

    copy = cfg.rollout.engine == "native" and autocast_of(cfg.model, cfg.system.backend) == "bfloat16"
    return LocalBackend(torch.bfloat16 if copy else None)


def check_model_path(cfg: Config) -> None:
    """A missing local model is named before any work starts (a hub id is resolved by ``run_settings.pin_model``)."""
    from ..policies.hub import looks_like_hub_id

    path = cfg.model.path
    if cfg.model.kind == "hf" and path and not os.path.exists(os.path.expanduser(path)) and not looks_like_hub_id(path):
        raise ConfigError(f"model.path={path!r} does not exist (model.kind=hf needs a local Hugging Face model "
                          f"directory or a hub id org/name)")


def build_state_checked(cfg: Config) -> TrainState:
    """``build_state``, with a model that cannot be loaded reported as a config error naming it."""
    try:
        return build_state(cfg)
    except (OSError, ValueError) as e:
        if cfg.model.kind != "hf" or isinstance(e, ConfigError):
            raise
        what = f"model.path={cfg.model.path!r}" if cfg.model.path else f"model.preset={cfg.model.preset!r}"
        raise ConfigError(f"{what} cannot be loaded: {one_line(e)}") from e
