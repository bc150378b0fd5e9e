"""The one config tree: dataclasses, loaded from YAML, with dotted ``key=value`` overrides.

The defaults *are* the built-in quickstart (tiny policies, two-agent Plan-Path on CPU), so ``atgrpo train``
with no config runs it. Every derived value is computed, and every value validated, in ``resolve``; errors
name the key and the valid choices, before any work starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from .algorithms.grouping import GROUP_KEYS
from .algorithms.losses import AGGREGATIONS, KL_ESTIMATORS

SHARING_LEVELS = ("L0", "L1", "L2", "L3")
ROLLOUT_MODES = ("tree", "trajectory")
MODEL_KINDS = ("tiny", "hf")


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and the valid choices."""


@dataclass
class EnvConfig:
    name: str = "plan_path"
    style: str = "compact"  # compact (tiny policies) | chat (LLMs)
    kwargs: dict[str, Any] = field(default_factory=lambda: {"size": 5, "wall_prob": 0.2, "max_turns": 3})


@dataclass
class TinyConfig:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 512


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny | hf (a local Hugging Face model directory in `path`)
    path: str | None = None
    tiny: TinyConfig = field(default_factory=TinyConfig)
    dtype: str = "float32"
    device: str = "cpu"
    max_prompt_tokens: int = 1024


@dataclass
class PolicyConfig:
    sharing: str = "L1"  # L0 single agent | L1 one shared policy | L2 per-role LoRA | L3 one model per role


@dataclass
class RolloutConfig:
    mode: str = "tree"  # tree (AT-GRPO) | trajectory (K independent episodes per problem)
    K: int = 8
    problems_per_step: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 16


@dataclass
class AlgoConfig:
    alpha: float = 1.0  # reward = alpha * team + local
    group_key: str = "problem_turn_agent"
    std_normalize: bool = True
    filter_zero_variance: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    lr: float = 3e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    minibatches: int = 2  # optimizer steps per policy per train step (one PPO epoch)
    micro_batch_size: int = 256  # sequences per forward/backward (gradient accumulation within a mini-batch)


@dataclass
class WarmStartConfig:
    enabled: bool = True
    episodes: int = 600  # scripted episodes on training problems
    noise: float = 0.3  # probability that each expert move is replaced by a random move
    epochs: int = 2
    lr: float = 1e-3
    batch_size: int = 64


@dataclass
class EvalConfig:
    problems: int = 200  # held-out problems (evaluation split)
    temperature: float = 0.0  # 0 = greedy
    every: int = 0  # also evaluate every N steps (0: only before and after training)


@dataclass
class TrainConfig:
    steps: int = 40
    dump_rollouts: list[int] = field(default_factory=list)  # steps to dump; empty = first and last
    tensorboard: bool = True
    plot: bool = True


@dataclass
class Config:
    seed: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- loading --------------------------------------------------------------------------------------------
def _build(cls, data: dict[str, Any], path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        if key not in fields:
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {', '.join(fields)}")
        sub = _dataclass_type(cls, key)
        kwargs[key] = _build(sub, value, full) if sub is not None else _coerce(fields[key], value, full)
    obj = cls(**kwargs)
    return obj


def _coerce(f: dataclasses.Field, value: Any, key: str) -> Any:
    """YAML 1.1 reads ``1e-4`` as a string: turn strings into floats where the field is a float. Bool fields
    take only true/false."""
    if isinstance(f.default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if isinstance(f.default, float) and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} must be a number") from None
    return value


def _dataclass_type(cls, name: str):
    default = cls.__dataclass_fields__[name].default_factory  # type: ignore[attr-defined]
    if default is dataclasses.MISSING:
        return None
    probe = default()
    return type(probe) if dataclasses.is_dataclass(probe) else None


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``dotted.key=value`` override to a plain dict (value parsed as YAML: 3, 0.5, true, [1, 2])."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            raise ConfigError(f"unknown config key {'.'.join(parts[:i + 1])!r} in override {item!r}; "
                              f"valid keys here: {', '.join(node)}")
        if not isinstance(node[part], dict):
            raise ConfigError(f"config key {'.'.join(parts[:i + 1])!r} is a value, not a section "
                              f"(override {item!r})")
        node = node[part]
    if parts[-1] not in node and not _is_free_dict(parts):
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {', '.join(node)}")
    value = yaml.safe_load(raw) if raw.strip() else ""
    if parts == ["env", "name"] and value != node["name"]:
        node["kwargs"] = {}  # another env: start from its own defaults (set env.kwargs.* after env.name)
    node[parts[-1]] = value


def _is_free_dict(parts: list[str]) -> bool:
    return len(parts) >= 2 and parts[0] == "env" and parts[1] == "kwargs"


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- overrides, then validated."""
    data = Config().to_dict()
    if path:
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path!r} not found (presets live in configs/, e.g. "
                              f"configs/quickstart.yaml)") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        _build(Config, loaded, "")  # reject unknown keys with the file's own structure
        env = loaded.get("env") or {}
        if "name" in env or "kwargs" in env:  # env kwargs belong to one env: a file's kwargs replace the defaults
            data["env"]["kwargs"] = {}
        data = _merge(data, loaded)
    for item in overrides:
        apply_override(data, item)
    cfg = _build(Config, data, "")
    validate(cfg)
    return cfg


def _choice(key: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(key: str, value: Any, allow_zero: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise ConfigError(f"{key}={value!r} must be a finite number {'>= 0' if allow_zero else '> 0'}")


def validate(cfg: Config) -> None:
    from .envs import PROMPT_STYLES, registered  # local import: envs are pure Python, this keeps import light

    _choice("env.name", cfg.env.name, list(registered()))
    _choice("env.style", cfg.env.style, PROMPT_STYLES)
    _choice("model.kind", cfg.model.kind, MODEL_KINDS)
    if cfg.model.kind == "hf" and not cfg.model.path:
        raise ConfigError("model.kind=hf needs model.path (a local Hugging Face model directory)")
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    _choice("policy.sharing", cfg.policy.sharing, SHARING_LEVELS)
    if cfg.policy.sharing == "L2":
        raise ConfigError("policy.sharing=L2 (per-role LoRA) is not implemented yet; use L0, L1 or L3")
    _choice("rollout.mode", cfg.rollout.mode, ROLLOUT_MODES)
    _choice("algo.group_key", cfg.algo.group_key, list(GROUP_KEYS))
    _choice("algo.aggregation", cfg.algo.aggregation, AGGREGATIONS)
    _choice("algo.kl_estimator", cfg.algo.kl_estimator, KL_ESTIMATORS)
    for key in ("rollout.K", "rollout.problems_per_step", "rollout.max_new_tokens", "algo.minibatches",
                "algo.micro_batch_size", "eval.problems", "warmstart.batch_size", "model.max_prompt_tokens"):
        sect, name = key.split(".")
        value = getattr(getattr(cfg, sect), name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}={value!r} must be an integer >= 1")
    for key in ("algo.lr", "algo.grad_clip", "warmstart.lr"):
        sect, name = key.split(".")
        _positive(key, getattr(getattr(cfg, sect), name))
    for key in ("rollout.temperature", "eval.temperature", "algo.clip_low", "algo.clip_high", "algo.kl_coef",
                "warmstart.noise", "train.steps", "eval.every", "warmstart.episodes", "warmstart.epochs"):
        sect, name = key.split(".")
        _positive(key, getattr(getattr(cfg, sect), name), allow_zero=True)
    if cfg.rollout.temperature == 0:
        raise ConfigError("rollout.temperature=0 makes all K candidates identical; use a temperature > 0")
