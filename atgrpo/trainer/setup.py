"""Building what a run needs from the config: the agent -> policy map, the policies, the environments.

Routing and grouping are separate (REFERENCE section 2): the agent -> policy map decides which policy acts
for (and is updated on the samples of) each agent; the group key never contains the policy id.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..config import Config, ConfigError
from ..envs import MultiAgentEnv, make
from ..policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model


def env_factory(cfg: Config) -> Callable[[str, int], MultiAgentEnv]:
    """A function (split, seed) -> a reset environment holding that problem."""
    kwargs = dict(cfg.env.kwargs)
    if cfg.policy.sharing == "L0":
        probe = make(cfg.env.name, style=cfg.env.style, **kwargs)
        if not probe.single_agent_roles:
            raise ConfigError(f"policy.sharing=L0: environment {cfg.env.name!r} has no single-agent variant")
        kwargs["roles"] = probe.single_agent_roles

    def build(split: str, seed: int) -> MultiAgentEnv:
        env = make(cfg.env.name, style=cfg.env.style, split=split, **kwargs)
        env.reset(seed)
        return env

    return build


def agent_to_policy(cfg: Config, agents: tuple[str, ...]) -> dict[str, str]:
    """L0: the single agent's own policy; L1: one 'shared' policy; L3: one policy per role (named by role)."""
    if cfg.policy.sharing in ("L0", "L1"):
        return {a: "shared" for a in agents}
    return {a: a for a in agents}


def build_policies(cfg: Config, policy_ids: list[str]) -> dict[str, CausalLMPolicy]:
    """One independent model (and later optimizer) per policy id, initialised from the run seed."""
    if cfg.model.kind != "tiny":
        raise ConfigError("model.kind=hf is not supported yet in this version; use model.kind=tiny")
    policies = {}
    for n, pid in enumerate(sorted(policy_ids)):
        model = build_tiny_model(TinyModelConfig(**vars(cfg.model.tiny)), seed=cfg.seed * 1000 + n)
        policies[pid] = CausalLMPolicy(pid, model.to(getattr(torch, cfg.model.dtype)), ByteTokenizer(),
                                       cfg.model.device, cfg.model.max_prompt_tokens)
    return policies


def problem_seed(run_seed: int, step: int, index: int, per_step: int) -> int:
    """The data sampler: training problem ``index`` of ``step``. Deterministic, so a resumed run sees the
    same problems; distinct across steps."""
    return run_seed * 10_000_019 + step * per_step + index
