"""The config checks that involve several fields, the environment or the machine (each field alone is checked by
``schema.check_fields`` from its declaration). Errors name the key and what would be valid."""

from __future__ import annotations

import os
import typing
from typing import Any

from .ray_fit import validate_pool_resources, validate_ray, validate_ray_fit
from .schema import Config, ConfigError, LoggingConfig, check_fields, coerce


def validate(cfg: Config, training: bool = True) -> None:
    """Every check that can be made before any work: each field against its declaration (``check_fields``:
    choices, ranges), then the combinations, the env's kwargs (the env is built once), the model's shape and
    device, and (Ray) whether the workers fit. ``training=False``: the config is only evaluated (``atgrpo
    eval``), so training-only checks are skipped."""
    from ..envs import PROMPT_STYLES  # local import: envs are pure Python, this keeps import light

    _resolve_env(cfg.env.name)
    _choice("env.style", cfg.env.style, PROMPT_STYLES)
    check_fields(cfg)
    _validate_model(cfg)
    _validate_precision(cfg)
    _validate_tiny(cfg)
    _validate_device(cfg.model.device)
    if cfg.policy.sharing == "L2":
        _validate_lora(cfg)
    if cfg.rollout.temperature == 0:
        raise ConfigError("rollout.temperature=0 makes all K candidates identical; use a temperature > 0")
    if training and cfg.rollout.K == 1 and cfg.train.steps > 0:
        raise ConfigError("rollout.K=1 puts one sample in every group, so every advantage is 0 and nothing is "
                          "learned; use rollout.K >= 2 (K=1 only for evaluation: train.steps=0, or atgrpo eval)")
    n_policies = validate_env(cfg)
    _validate_logging(cfg.logging)
    validate_ray(cfg.system.ray)
    _validate_update_sharding(cfg)
    if cfg.system.backend == "ray":
        validate_ray_fit(cfg.system.ray, n_policies)
    if cfg.rollout.engine == "vllm":
        _validate_vllm(cfg)


def _validate_precision(cfg: Config) -> None:
    """``model.precision`` against ``model.dtype`` and ``model.autocast``: one meaning, no contradiction."""
    m = cfg.model
    if m.dtype != "float32" and m.precision not in ("auto", m.dtype):
        raise ConfigError(f"model.precision={m.precision} needs float32 master weights, but model.dtype={m.dtype}; "
                          f"set model.dtype=float32 or drop model.precision")
    if m.precision == "float32" and m.autocast != "none":
        raise ConfigError(f"model.precision=float32 contradicts model.autocast={m.autocast}; drop one of them")


def _choice(key: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _validate_logging(lg: LoggingConfig) -> None:
    """Each backend installed (found without importing it), and a project name."""
    import importlib.util

    for i, b in enumerate(lg.backends):
        if b != "tensorboard" and importlib.util.find_spec(b) is None:
            raise ConfigError(f"logging.backends has {b}, which is not installed here: pip install -e '.[{b}]' "
                              f"(or drop it from logging.backends)")
    if not lg.project:
        raise ConfigError("logging.project must be a non-empty name (the wandb project, the mlflow experiment)")


def _validate_update_sharding(cfg: Config) -> None:
    """FSDP2 sharding (``system.ray.update_sharding=fsdp``) is tested on whole-model policies, with and without
    gradient checkpointing (tests/test_fsdp.py); LoRA (L2) is refused rather than left untried."""
    if cfg.system.ray.update_sharding != "fsdp":
        return
    if cfg.policy.sharing == "L2":
        raise ConfigError("system.ray.update_sharding=fsdp is not supported with policy.sharing=L2 (per-role LoRA "
                          "adapters are small: use update_sharding=replicate)")


def _validate_vllm(cfg: Config) -> None:
    if cfg.model.kind != "hf":
        raise ConfigError(f"rollout.engine=vllm needs model.kind=hf (a Hugging Face model directory vLLM can load); "
                          f"model.kind={cfg.model.kind!r} runs on rollout.engine=native")
    if cfg.system.backend != "local":
        raise ConfigError("rollout.engine=vllm runs with system.backend=local (the Ray backend samples with the "
                          "native engine on its rollout workers)")
    # whether the engine's Python has vLLM is a fact about the machine, not the config: the pre-flight checks it
    # (``preflight.py``: ``atgrpo check`` lists it with every other finding, ``atgrpo train`` stops on it first)


def _validate_tiny(cfg: Config) -> None:
    """The tiny model's shape: heads divide the width into even head sizes."""
    t = cfg.model.tiny
    if cfg.model.kind != "tiny":
        return
    if t.hidden_size % t.num_heads:
        raise ConfigError(f"model.tiny.hidden_size={t.hidden_size} must be a multiple of model.tiny.num_heads="
                          f"{t.num_heads} (each attention head gets hidden_size / num_heads dimensions)")
    if (t.hidden_size // t.num_heads) % 2:
        raise ConfigError(f"model.tiny.hidden_size / model.tiny.num_heads = {t.hidden_size // t.num_heads} must be "
                          f"even (rotary position embeddings rotate pairs of dimensions)")


def _validate_device(device: str) -> None:
    """``model.device`` names a device this machine has (torch is imported only for a device other than cpu)."""
    if device == "cpu":
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"model.device={device!r} is not a device; e.g. cpu, cuda, cuda:1") from None
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"model.device={device!r} but torch sees no CUDA device on this machine (torch "
                              f"{torch.__version__}, {build}); use model.device=cpu")
        if d.index is not None and d.index >= n:
            raise ConfigError(f"model.device={device!r} but this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    elif d.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"model.device={device!r} but MPS is not available here; use model.device=cpu")
    elif d.type != "cpu":
        raise ConfigError(f"model.device={device!r} is not supported; use cpu, cuda[:N] or mps")


def _resolve_env(name: Any):
    """The factory of ``env.name``: a registered name, ``module:Class`` (imported), or an ``atgrpo.envs`` entry
    point; anything else is a ``ConfigError`` naming the choices."""
    from ..envs import registry

    try:
        return registry.resolve(name)
    except registry.EnvError as e:
        raise ConfigError(f"env.name={name!r}: {e}") from None


_ENV_SET_BY_ATGRPO = {"style": "env.style", "split": "atgrpo (train and evaluation problems)"}


def validate_env(cfg: Config) -> int:
    """``env.kwargs`` fit the environment: every key a parameter of its constructor, simple types as annotated,
    and the environment builds and resets once. Returns the number of policies the run will build."""
    import inspect

    from ..envs import registry

    factory = _resolve_env(cfg.env.name)
    kwargs = cfg.env.kwargs
    for k in kwargs:
        if k in _ENV_SET_BY_ATGRPO:
            raise ConfigError(f"env.kwargs.{k} is set by {_ENV_SET_BY_ATGRPO[k]}; remove it from env.kwargs")
    try:
        sig = inspect.signature(factory, eval_str=True)
    except Exception:  # an annotation that does not evaluate here: check names only
        try:
            sig = inspect.signature(factory)
        except (TypeError, ValueError):  # no signature to read: building the env below is the check
            sig = inspect.Signature([inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    params = {n: p for n, p in sig.parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in _ENV_SET_BY_ATGRPO}
    if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        for k in kwargs:
            if k not in params:
                raise ConfigError(f"unknown config key 'env.kwargs.{k}': not a parameter of env {cfg.env.name!r}; "
                                  f"valid keys here: {', '.join(params)}")
    for k, v in kwargs.items():
        hint = params[k].annotation if k in params else inspect.Parameter.empty
        simple = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
        if len(simple) == 1 and simple[0] in (int, float, bool, str) and not (v is None and type(None) in
                                                                           typing.get_args(hint)):
            coerce(simple[0], v, f"env.kwargs.{k}")
    kwargs = dict(kwargs)
    try:
        env = registry.make(cfg.env.name, style=cfg.env.style, **kwargs)
        roles = env.single_agent_roles if cfg.policy.sharing == "L0" else None
        if cfg.policy.sharing == "L0" and not roles:
            raise ConfigError(f"policy.sharing=L0: environment {cfg.env.name!r} has no single-agent variant")
        if roles:
            env = registry.make(cfg.env.name, style=cfg.env.style, **{**kwargs, "roles": roles})
        env.reset(0)
        _validate_per_agent(cfg, env.agents, env.name)
    except ConfigError:
        raise
    except registry.EnvError as e:  # a user environment that fails check_env on its first build
        raise ConfigError(f"env.name={cfg.env.name!r}: {e}") from None
    except Exception as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(f"env.kwargs={kwargs!r} do not fit env {cfg.env.name!r}: {msg}") from None
    policies = set(route_agents(cfg, env.agents).values())
    validate_pool_resources(cfg.system.ray, policies)
    return len(policies)


def route_agents(cfg, agents: tuple[str, ...]) -> dict[str, str]:
    """Agent -> policy id. L0: the single agent's own policy; L1: one 'shared' policy; L2 (one adapter per
    policy) and L3 (one model per policy): one policy per role, named by role, or ``policy.groups``' partition
    of the roles (each role in exactly one group, named by the group)."""
    groups = cfg.policy.groups
    if cfg.policy.sharing in ("L0", "L1"):
        if groups:
            raise ConfigError(f"policy.groups partitions roles into policies: it needs policy.sharing=L2 or L3 "
                              f"(got {cfg.policy.sharing}, which has one policy)")
        return {a: "shared" for a in agents}
    if not groups:
        return {a: a for a in agents}
    if not isinstance(groups, dict) or not all(isinstance(r, list) and r for r in groups.values()):
        raise ConfigError(f"policy.groups must map policy names to non-empty lists of roles, got {groups!r}")
    seen = [r for roles in groups.values() for r in roles]
    unknown = sorted(set(seen) - set(agents))
    twice = sorted({r for r in seen if seen.count(r) > 1})
    missing = [a for a in agents if a not in seen]
    if unknown or twice or missing:
        raise ConfigError("policy.groups must put every role in exactly one group (roles: " + ", ".join(agents)
                          + ")" + (f"; unknown: {unknown}" if unknown else "") + (f"; in two groups: {twice}"
                          if twice else "") + (f"; in none: {missing}" if missing else ""))
    return {a: next(str(g) for g, roles in groups.items() if a in roles) for a in agents}


PER_AGENT_KEYS = ("temperature", "max_new_tokens", "stop")


def _validate_per_agent(cfg: Config, agents: tuple[str, ...], env_name: str) -> None:
    """``rollout.per_agent``: each key a role of the run's agents, each value one of PER_AGENT_KEYS."""
    per = cfg.rollout.per_agent
    if not isinstance(per, dict):
        raise ConfigError(f"rollout.per_agent={per!r} must be a mapping role -> {{temperature, max_new_tokens, stop}}")
    for role, spec in per.items():
        key = f"rollout.per_agent.{role}"
        if role not in agents:
            raise ConfigError(f"{key}: {role!r} is not an agent of env {env_name!r} here (agents: {', '.join(agents)})")
        if not isinstance(spec, dict):
            raise ConfigError(f"{key}={spec!r} must be a mapping with any of: {', '.join(PER_AGENT_KEYS)}")
        for k, v in spec.items():
            if k not in PER_AGENT_KEYS:
                raise ConfigError(f"unknown config key '{key}.{k}'; valid keys here: {', '.join(PER_AGENT_KEYS)}")
        if "temperature" in spec:
            t = coerce(float, spec["temperature"], f"{key}.temperature")
            if t <= 0:
                raise ConfigError(f"{key}.temperature={t!r} must be a finite number > 0 (0 would make all K "
                                  f"candidates identical)")
            spec["temperature"] = t
        if "max_new_tokens" in spec:
            m = coerce(int, spec["max_new_tokens"], f"{key}.max_new_tokens")
            if m < 1:
                raise ConfigError(f"{key}.max_new_tokens={m!r} must be an integer >= 1")
        if "stop" in spec:
            stop = spec["stop"]
            stops = [stop] if isinstance(stop, str) else stop
            if not (isinstance(stops, list) and all(isinstance(x, str) and x for x in stops)):
                raise ConfigError(f"{key}.stop={stop!r} must be a non-empty string or a list of them")
            spec["stop"] = list(stops)


def max_new_tokens_any(cfg: Config) -> int:
    """The longest response any role may write (``rollout.max_new_tokens`` or a role's own, if longer)."""
    own = [spec.get("max_new_tokens", 0) for spec in cfg.rollout.per_agent.values() if isinstance(spec, dict)]
    return max([cfg.rollout.max_new_tokens, *own])


def _validate_model(cfg: Config) -> None:
    """model.kind=hf: a path or a preset; a path must exist here (a hub id is named as such: no downloads)."""
    m = cfg.model
    if m.kind != "hf":
        if m.preset or m.gguf_file:
            raise ConfigError(f"model.preset / model.gguf_file need model.kind=hf (model.kind={m.kind!r})")
        return
    if m.preset is None and m.path and not m.gguf_file and os.path.isfile(os.path.expanduser(m.path)):
        gguf = ", and model.gguf_file for a GGUF file" if m.path.endswith(".gguf") else ""
        raise ConfigError(f"model.path={m.path!r} is a file; give the model's directory (config.json, weights, "
                          f"tokenizer files){gguf}")
    from ..policies.hf import PRESETS, model_source_error  # local import: pulls in torch
    from ..policies.hub import looks_like_hub_id

    if m.revision is not None and not looks_like_hub_id(m.path):
        raise ConfigError(f"model.revision={m.revision!r} goes with a hub id in model.path (org/name); "
                          f"model.path={m.path!r} is not one")

    if m.preset is not None:
        _choice("model.preset", m.preset, list(PRESETS))
        if m.gguf_file and not os.path.isfile(os.path.expanduser(m.gguf_file)):
            raise ConfigError(f"model.gguf_file={m.gguf_file!r} (the GGUF of model.preset={m.preset}) does not exist")
    elif not m.path:
        raise ConfigError("model.kind=hf needs model.path (a local Hugging Face model directory) or model.preset "
                          f"(one of: {', '.join(PRESETS)})")
    else:
        err = model_source_error(m.path, m.gguf_file)
        if err:
            raise ConfigError(err)


def _validate_lora(cfg: Config) -> None:
    tm = cfg.policy.lora.target_modules
    if not (isinstance(tm, str) and tm) and not (isinstance(tm, list) and tm and all(isinstance(x, str) for x in tm)):
        raise ConfigError(f"policy.lora.target_modules={tm!r} must be 'all-linear' or a list of module names")
