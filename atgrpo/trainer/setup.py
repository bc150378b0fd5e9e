"""Building what a run needs from the config: the agent -> policy map, the policies, the environments.

Routing and grouping are separate (docs/method.md): the agent -> policy map decides which policy acts
for (and is updated on the samples of) each agent; the group key never contains the policy id.

Policies: ``model.kind=tiny`` (the built-in tiny model, byte tokenizer) or ``hf`` (any local Hugging Face causal
LM, a GGUF file, or a preset: ``policies/hf.py``). L2 builds one base model and one LoRA adapter per role; each
role's policy sees the shared model through its own adapter (``policies/lora.py``).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..config import Config, ConfigError
from ..envs import MultiAgentEnv, make
from ..policies import ByteTokenizer, CausalLMPolicy, build_tiny_model
from ..policies.cascade import enable_checkpointing
from ..policies.precision import apply_autocast, autocast_of
from ..rollout.sampling import Sampling


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


def build_policies(cfg: Config, policy_ids: list[str]) -> dict[str, CausalLMPolicy]:
    """One policy per policy id: L0/L1/L3 each an independent model (and later optimizer), initialised from
    the run seed; L2 one LoRA adapter per id on one shared, frozen base model."""
    ids = sorted(policy_ids)
    if cfg.policy.sharing == "L2":
        from ..policies.lora import AdapterView, attach_adapters

        base, tok = _base_model(cfg, 0)
        shared = attach_adapters(base, ids, cfg.policy.lora, seed=cfg.seed * 1000 + 999)
        return {pid: _policy(cfg, pid, AdapterView(shared, pid, save_base=cfg.model.kind == "tiny"), tok)
                for pid in ids}
    policies = {}
    for n, pid in enumerate(ids):
        model, tok = _base_model(cfg, n)
        policies[pid] = _policy(cfg, pid, model, tok)
    return policies


def build_policy(cfg: Config, pid: str, policy_ids: list[str]) -> CausalLMPolicy:
    """The policy ``pid`` exactly as ``build_policies(cfg, policy_ids)`` builds it, without building the others
    (L2: every adapter sits on one base model, so that model is built with all of them). A Ray worker's policy."""
    if cfg.policy.sharing == "L2":
        return build_policies(cfg, policy_ids)[pid]
    model, tok = _base_model(cfg, sorted(policy_ids).index(pid))
    return _policy(cfg, pid, model, tok)


def _base_model(cfg: Config, n: int):
    """(model, tokenizer): the tiny model (seeded per policy index ``n``) or the configured HF model, on its
    device, with gradient checkpointing as configured and under bfloat16 autocast when the run's precision is
    bfloat16 on float32 weights (``precision.autocast_of``)."""
    if cfg.model.kind == "tiny":
        model = build_tiny_model(cfg.model.tiny, seed=cfg.seed * 1000 + n)
        model, tok = model.to(getattr(torch, cfg.model.dtype)), ByteTokenizer()
    else:
        from ..policies.hf import ModelNotFound, load_hf_model

        try:
            model, tok = load_hf_model(cfg.model)
        except ModelNotFound as e:
            raise ConfigError(str(e)) from None
    if cfg.model.gradient_checkpointing:
        enable_checkpointing(model)
    return apply_autocast(model.to(cfg.model.device), autocast_of(cfg.model, cfg.system.backend)), tok


def _policy(cfg: Config, pid: str, model, tok) -> CausalLMPolicy:
    """A tiny model on the CPU: the plain policy; otherwise ``HFPolicy`` (chat template variables, sampling
    on an accelerator with the trainer's CPU generator)."""
    if cfg.model.kind == "tiny" and cfg.model.device == "cpu":
        policy = CausalLMPolicy(pid, model, tok, cfg.model.device, cfg.model.max_prompt_tokens)
    else:
        from ..policies.hf import make_hf_policy

        policy = make_hf_policy(pid, model, tok, cfg.model)
    policy.cuda_graphs = cfg.rollout.cuda_graphs
    return policy


def problem_seed(run_seed: int, step: int, index: int, per_step: int) -> int:
    """The data sampler: training problem ``index`` of ``step``. Deterministic, so a resumed run sees the
    same problems; distinct across steps."""
    return run_seed * 10_000_019 + step * per_step + index


def train_sampling(cfg: Config) -> Sampling:
    """The training rollout's sampling: ``rollout.K`` candidates per node at ``rollout.temperature``, the roles'
    own settings of ``rollout.per_agent``."""
    r = cfg.rollout
    return Sampling(r.K, r.temperature, r.max_new_tokens, cfg.algo.alpha, r.per_agent)


def eval_sampling(cfg: Config, K: int = 1, temperature: float | None = None) -> Sampling:
    """Evaluation's sampling: ``K`` episodes per problem at ``eval.temperature`` (or ``temperature``); the roles'
    own max_new_tokens and stop strings apply, their training temperatures do not."""
    per_agent = {role: {k: v for k, v in spec.items() if k != "temperature"}
                 for role, spec in cfg.rollout.per_agent.items()}
    return Sampling(K, cfg.eval.temperature if temperature is None else temperature, cfg.rollout.max_new_tokens,
                    cfg.algo.alpha, per_agent)
