"""The one config tree: dataclasses, loaded from YAML, with dotted ``key=value`` overrides.

The defaults *are* the built-in quickstart (tiny policies, two-agent Plan-Path on CPU), so ``atgrpo train``
with no config runs it. Every derived value is computed, and every value validated, in ``resolve``; errors
name the key and the valid choices, before any work starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from .algorithms.grouping import GROUP_KEYS
from .algorithms.names import AGGREGATIONS, KL_ESTIMATORS

SHARING_LEVELS = ("L0", "L1", "L2", "L3")
ROLLOUT_MODES = ("tree", "trajectory")
ROLLOUT_ENGINES = ("native", "vllm")
MODEL_KINDS = ("tiny", "hf")
BACKENDS = ("local", "ray")


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
    kind: str = "tiny"  # tiny | hf (a local Hugging Face model directory in `path`, or a `preset`)
    path: str | None = None  # hf: a local model directory (never a hub id: nothing is downloaded)
    preset: str | None = None  # hf: a named model, e.g. smollm2-135m (see docs/models.md)
    gguf_file: str | None = None  # hf: a GGUF file in `path` (dequantized once, cached); with a preset, its file
    enable_thinking: bool = False  # hf: passed to the chat template (Qwen3's thinking mode; the paper: off)
    gradient_checkpointing: bool = False  # hf: recompute activations in backward (needs algo.shared_prefix=false)
    tiny: TinyConfig = field(default_factory=TinyConfig)
    dtype: str = "float32"  # float32 on CPU; bfloat16 on GPU
    device: str = "cpu"
    max_prompt_tokens: int = 1024


@dataclass
class LoRAConfig:
    rank: int = 16
    alpha: float = 32.0
    target_modules: Any = "all-linear"  # "all-linear" (every linear layer but the LM head) or a list of names
    dropout: float = 0.0


@dataclass
class PolicyConfig:
    sharing: str = "L1"  # L0 single agent | L1 one shared policy | L2 per-role LoRA | L3 one model per role
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # L2: one adapter per role on one frozen base model


@dataclass
class VLLMConfig:
    """``rollout.engine=vllm`` (docs/models.md, "The vLLM engine"): where and how the engine process runs."""

    python: str | None = None  # the Python that has vLLM (null: $ATGRPO_VLLM_PYTHON, else this interpreter)
    gpu_memory_utilization: float = 0.5  # GPU: the share of its memory vLLM may claim
    kv_cache_gb: float = 1.0  # CPU: the KV cache size in GiB (set explicitly, vLLM skips its RAM-share check)
    cpu_threads: str | None = None  # CPU: cores for vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND, e.g. 0-1)
    max_model_len: int = 0  # 0: model.max_prompt_tokens + rollout.max_new_tokens
    startup_timeout_s: float = 900.0


@dataclass
class RolloutConfig:
    mode: str = "tree"  # tree (AT-GRPO) | trajectory (K independent episodes per problem)
    K: int = 8
    problems_per_step: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 12
    engine: str = "native"  # native (cascade decoding on transformers) | vllm (model.kind=hf; docs/models.md)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    # a role's own sampling, over the values above: {coder: {max_new_tokens: 1024}, tester: {max_new_tokens: 128,
    # temperature: 0.8, stop: ["</test>"]}}; the loss scores each sample at the temperature it was drawn at
    per_agent: dict[str, Any] = field(default_factory=dict)


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
    lr: float = 2e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    minibatches: int = 2  # optimizer steps per policy per train step (one PPO epoch)
    micro_batch_size: int = 256  # sequences per forward/backward (gradient accumulation within a mini-batch)
    shared_prefix: bool = True  # run each distinct prompt once in the loss, K responses on its KV cache (exact)
    update_token_budget: int = 16384  # shared_prefix: padded tokens per forward/backward (micro-batch size)


@dataclass
class WarmStartConfig:
    enabled: bool = True
    episodes: int = 350  # scripted episodes on training problems
    noise: float = 0.3  # expert corruption: each answer character replaced (typed answers), or one bug (programs)
    epochs: int = 2
    lr: float = 1e-3
    batch_size: int = 64  # demonstrations per optimizer step
    token_budget: int = 16384  # padded tokens per forward/backward (a batch is split to fit: real models)


@dataclass
class EvalConfig:
    problems: int = 200  # held-out problems (evaluation split)
    temperature: float = 0.0  # 0 = greedy
    every: int = 10  # also evaluate every N steps (0: only before and after training)


@dataclass
class TrainConfig:
    steps: int = 40
    dump_rollouts: list[int] = field(default_factory=list)  # steps to dump; empty = first and last
    tensorboard: bool = True
    plot: bool = True
    checkpoint_every: int = 10  # steps between checkpoints (0: only at the end and on a stop signal)
    keep_checkpoints: int = 2  # step checkpoints kept (the newest ones); checkpoint/final is always kept
    max_nonfinite: int = 3  # stop with an error after this many skipped non-finite updates
    threads: int = 0  # torch CPU threads (0: OMP_NUM_THREADS if set, else the cores free now: usable cores minus
    # the load average, at least 1; atgrpo/threads.py). The choice is printed and written to config.yaml


@dataclass
class RayConfig:
    """Placement of the Ray backend (docs/ray.md). Workers are Ray actors; each policy has a placement group
    holding its rollout and update workers."""

    address: str | None = None  # an existing cluster ("auto", "ray://head:10001"); None: start a local one
    num_cpus: int | None = None  # local cluster only: logical CPUs it offers (None: what Ray detects here)
    num_rollout_workers: int = 1  # per policy: inference actors (1 keeps the local backend's random stream)
    num_update_workers: int = 1  # per policy: data-parallel optimisation actors (torch.distributed)
    num_env_workers: int = 2  # CPU actors that step environments (and run their sandboxed code)
    cpus_per_worker: float | None = None  # CPUs reserved per rollout / update worker (in its policy's placement
    # group); None: a local cluster's CPUs shared by all workers (at most 1 each), 1 on an existing cluster
    gpus_per_worker: float = 0.0  # GPUs reserved per rollout / update worker (> 0: model on cuda, NCCL)
    cpus_per_env_worker: float | None = None  # CPUs reserved per environment worker (None: as cpus_per_worker)
    env_retries: int = 3  # resubmissions of one environment task after its worker died, before the step fails


@dataclass
class TrainerConfig:
    backend: str = "local"  # local (everything in this process) | ray (actors, possibly on many machines)
    ray: RayConfig = field(default_factory=RayConfig)


@dataclass
class LoggingConfig:
    """Where metrics go besides metrics.jsonl (the same names everywhere); the resolved config is logged as the
    run's parameters. wandb and mlflow are extras: pip install -e '.[wandb]' / '.[mlflow]'."""

    backends: list[str] = field(default_factory=lambda: ["tensorboard"])  # any of: tensorboard, wandb, mlflow
    project: str = "atgrpo"  # the wandb project and the mlflow experiment
    run_name: str | None = None  # null: the run directory's name
    wandb_mode: str = "offline"  # offline (files in RUN_DIR/wandb, `wandb sync` later) | online (needs a login)
    mlflow_tracking_uri: str | None = None  # null: a file store in the run directory, file:RUN_DIR/mlruns


LOGGING_BACKENDS = ("tensorboard", "wandb", "mlflow")


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
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- loading --------------------------------------------------------------------------------------------
def _build(cls, data: dict[str, Any], path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        if key not in fields:
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {', '.join(fields)}")
        sub = _dataclass_type(cls, key)
        kwargs[key] = _build(sub, value, full) if sub is not None else _coerce(hints[key], value, full)
    obj = cls(**kwargs)
    return obj


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the field's type and convert where it is safe, naming the key on failure.

    YAML 1.1 reads ``1e-4`` as a string: float fields take numeric strings. Integer fields take only integers
    (``2.5`` and ``abc`` are errors, never truncated); bool fields only true/false; every float is finite."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = args[0]
    origin = typing.get_origin(hint) or hint
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r} must be a number") from None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} must be a finite number (not nan or inf)")
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # model.path=2024: YAML reads a number
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} must be a string")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} must be a list, e.g. [1, 2]")
        (item,) = typing.get_args(hint) or (Any,)
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping, e.g. {{a: 1}}")
        return value
    return value  # Any: checked by its own validator


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
        if part not in node and i >= 2 and _is_free_dict(parts):  # rollout.per_agent.<role>.<key>
            node[part] = {}
        if part not in node:
            raise ConfigError(f"unknown config key {'.'.join(parts[:i + 1])!r} in override {item!r}; "
                              f"valid keys here: {', '.join(node)}")
        if not isinstance(node[part], dict):
            raise ConfigError(f"config key {'.'.join(parts[:i + 1])!r} is a value, not a section "
                              f"(override {item!r})")
        node = node[part]
    if parts[-1] not in node and not _is_free_dict(parts):
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {', '.join(node)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)})") from None
    if parts == ["env", "name"] and value != node["name"]:
        node["kwargs"] = {}  # another env: start from its own defaults (set env.kwargs.* after env.name)
    node[parts[-1]] = value


def _is_free_dict(parts: list[str]) -> bool:
    return len(parts) >= 2 and parts[:2] in (["env", "kwargs"], ["rollout", "per_agent"])


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where it is."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml_file(path: str) -> Any:
    """The parsed YAML of a config file; every way it can fail is one ``ConfigError`` naming the file."""
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory; give a YAML file (e.g. configs/quickstart.yaml; "
                          f"to continue a run directory: atgrpo train --resume DIR)")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (presets live in configs/, e.g. "
                          f"configs/quickstart.yaml)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path!r} is not a text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e.strerror or e}") from None


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                training: bool = True) -> Config:
    """Defaults <- YAML file <- overrides, then validated (``training=False``: for evaluation only, which
    accepts settings that only training refuses, such as ``rollout.K=1``)."""
    data = Config().to_dict()
    if path:
        loaded = read_yaml_file(path)
        loaded = {} if loaded is None else loaded
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping (key: value lines), not a "
                              f"{type(loaded).__name__}")
        _build(Config, loaded, "")  # reject unknown keys with the file's own structure
        env = loaded.get("env") or {}
        if "name" in env or "kwargs" in env:  # env kwargs belong to one env: a file's kwargs replace the defaults
            data["env"]["kwargs"] = {}
        data = _merge(data, loaded)
    for item in overrides:
        apply_override(data, item)
    cfg = _build(Config, data, "")
    validate(cfg, training=training)
    return cfg


def load_resume_config(run_dir: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config of the run in ``run_dir``; only ``train.steps=N`` may be overridden (to extend the run)."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"cannot resume {run_dir!r}: not a run directory (no config.yaml)")
    for item in overrides:
        if item.split("=", 1)[0].strip() != "train.steps":
            raise ConfigError(f"a resumed run keeps its config ({path}); only train.steps=N may be given (to "
                              f"extend the run), not {item!r}")
    return load_config(path, overrides)


def _choice(key: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(key: str, value: Any, allow_zero: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise ConfigError(f"{key}={value!r} must be a finite number {'>= 0' if allow_zero else '> 0'}")


def validate(cfg: Config, training: bool = True) -> None:
    """Every check that can be made before any work: keys, types, ranges, choices, combinations, the env's
    kwargs (the env is built once), the model's shape and device, and (Ray) whether the workers fit.
    ``training=False``: the config is only evaluated (``atgrpo eval``), so training-only checks are skipped."""
    from .envs import PROMPT_STYLES  # local import: envs are pure Python, this keeps import light

    _resolve_env(cfg.env.name)
    _choice("env.style", cfg.env.style, PROMPT_STYLES)
    _choice("model.kind", cfg.model.kind, MODEL_KINDS)
    _validate_model(cfg)
    _validate_tiny(cfg)
    _validate_device(cfg.model.device)
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    _choice("policy.sharing", cfg.policy.sharing, SHARING_LEVELS)
    if cfg.policy.sharing == "L2":
        _validate_lora(cfg)
    _choice("rollout.mode", cfg.rollout.mode, ROLLOUT_MODES)
    _choice("rollout.engine", cfg.rollout.engine, ROLLOUT_ENGINES)
    _choice("algo.group_key", cfg.algo.group_key, list(GROUP_KEYS))
    _choice("algo.aggregation", cfg.algo.aggregation, AGGREGATIONS)
    _choice("algo.kl_estimator", cfg.algo.kl_estimator, KL_ESTIMATORS)
    for key in ("rollout.K", "rollout.problems_per_step", "rollout.max_new_tokens", "algo.minibatches",
                "algo.micro_batch_size", "eval.problems", "warmstart.batch_size", "warmstart.token_budget", "model.max_prompt_tokens",
                "train.keep_checkpoints", "train.max_nonfinite"):
        sect, name = key.split(".")
        value = getattr(getattr(cfg, sect), name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}={value!r} must be an integer >= 1")
    budget = cfg.algo.update_token_budget
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ConfigError(f"algo.update_token_budget={budget!r} must be an integer >= 1 (padded tokens per pass)")
    for key in ("algo.lr", "algo.grad_clip", "warmstart.lr"):
        sect, name = key.split(".")
        _positive(key, getattr(getattr(cfg, sect), name))
    for key in ("rollout.temperature", "eval.temperature", "algo.clip_low", "algo.clip_high", "algo.kl_coef",
                "warmstart.noise", "train.steps", "eval.every", "warmstart.episodes", "warmstart.epochs"):
        sect, name = key.split(".")
        _positive(key, getattr(getattr(cfg, sect), name), allow_zero=True)
    for name, zero in (("checkpoint_every", "only at the end"), ("threads", "OMP_NUM_THREADS, else the free cores")):
        v = getattr(cfg.train, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"train.{name}={v!r} must be an integer >= 0 (0: {zero})")
    _positive("algo.weight_decay", cfg.algo.weight_decay, allow_zero=True)
    if cfg.rollout.temperature == 0:
        raise ConfigError("rollout.temperature=0 makes all K candidates identical; use a temperature > 0")
    if training and cfg.rollout.K == 1 and cfg.train.steps > 0:
        raise ConfigError("rollout.K=1 puts one sample in every group, so every advantage is 0 and nothing is "
                          "learned; use rollout.K >= 2 (K=1 only for evaluation: train.steps=0, or atgrpo eval)")
    n_policies = _validate_env(cfg)
    _validate_logging(cfg.logging)
    _choice("trainer.backend", cfg.trainer.backend, BACKENDS)
    _validate_ray(cfg.trainer.ray)
    if cfg.trainer.backend == "ray":
        _validate_ray_fit(cfg.trainer.ray, n_policies)
    if cfg.rollout.engine == "vllm":
        _validate_vllm(cfg)


def _validate_logging(lg: LoggingConfig) -> None:
    """Known backends, each installed (found without importing it), and a wandb mode."""
    import importlib.util

    for i, b in enumerate(lg.backends):
        _choice(f"logging.backends[{i}]", b, LOGGING_BACKENDS)
        if b != "tensorboard" and importlib.util.find_spec(b) is None:
            raise ConfigError(f"logging.backends has {b}, which is not installed here: pip install -e '.[{b}]' "
                              f"(or drop it from logging.backends)")
    _choice("logging.wandb_mode", lg.wandb_mode, ("offline", "online"))
    if not lg.project:
        raise ConfigError("logging.project must be a non-empty name (the wandb project, the mlflow experiment)")


def _validate_vllm(cfg: Config) -> None:
    if cfg.model.kind != "hf":
        raise ConfigError(f"rollout.engine=vllm needs model.kind=hf (a Hugging Face model directory vLLM can load); "
                          f"model.kind={cfg.model.kind!r} runs on rollout.engine=native")
    if cfg.trainer.backend != "local":
        raise ConfigError("rollout.engine=vllm runs with trainer.backend=local (the Ray backend samples with the "
                          "native engine on its rollout workers)")
    v = cfg.rollout.vllm
    if not (isinstance(v.gpu_memory_utilization, (int, float)) and 0 < v.gpu_memory_utilization <= 1):
        raise ConfigError(f"rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization!r} must be in (0, 1]")
    _positive("rollout.vllm.kv_cache_gb", v.kv_cache_gb)
    _positive("rollout.vllm.startup_timeout_s", v.startup_timeout_s)
    if not isinstance(v.max_model_len, int) or isinstance(v.max_model_len, bool) or v.max_model_len < 0:
        raise ConfigError(f"rollout.vllm.max_model_len={v.max_model_len!r} must be an integer >= 0 (0: prompt + "
                          f"response budget)")
    from .rollout.vllm_engine import engine_python, vllm_missing  # local import: pulls in torch

    err = vllm_missing(engine_python(v))
    if err:
        raise ConfigError(err)


def _validate_ray(r: RayConfig) -> None:
    if r.address is not None and not (isinstance(r.address, str) and r.address):
        raise ConfigError(f"trainer.ray.address={r.address!r} must be a cluster address (e.g. auto) or null")
    if r.num_cpus is not None and (not isinstance(r.num_cpus, int) or isinstance(r.num_cpus, bool) or r.num_cpus < 1):
        raise ConfigError(f"trainer.ray.num_cpus={r.num_cpus!r} must be an integer >= 1 or null (every core)")
    for name in ("num_rollout_workers", "num_update_workers", "num_env_workers", "env_retries"):
        v = getattr(r, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "env_retries" else 1):
            raise ConfigError(f"trainer.ray.{name}={v!r} must be an integer >= {0 if name == 'env_retries' else 1}")
    for name, least in (("cpus_per_worker", RAY_MIN_FRACTION), ("cpus_per_env_worker", 0.0)):
        v = getattr(r, name)  # > 0 for pool workers: a placement-group bundle may not be empty
        if v is not None and not (v >= least and (v == 0 or v >= RAY_MIN_FRACTION)):
            raise ConfigError(f"trainer.ray.{name}={v!r} must be {'>' if least else '>='} 0 (Ray's smallest "
                              f"share is {RAY_MIN_FRACTION}), or null: share the local cluster's CPUs")
    _positive("trainer.ray.gpus_per_worker", r.gpus_per_worker, allow_zero=True)


RAY_MIN_FRACTION = 0.0001  # Ray's resolution for fractional resources


def local_ray_cpus(r: RayConfig) -> int:
    """The CPUs of the local Ray cluster atgrpo starts: ``trainer.ray.num_cpus``, else what Ray detects on this
    machine (cgroup limits included)."""
    if r.num_cpus is not None:
        return r.num_cpus
    try:
        from ray._private.utils import get_num_cpus  # what ray.init would offer by default

        return max(1, int(get_num_cpus()))
    except Exception:  # another Ray version: the plain count
        return os.cpu_count() or 1


def ray_cpu_shares(r: RayConfig, n_policies: int, cluster_cpus: float) -> tuple[float, float]:
    """(CPUs per rollout/update worker, CPUs per environment worker) on a cluster offering ``cluster_cpus``.

    A value left null shares what the set values leave free, equally among those workers (at most 1 CPU each,
    in Ray's steps of 0.0001). Raises ``ConfigError`` when the workers cannot all be placed."""
    n_pool = n_policies * (r.num_rollout_workers + r.num_update_workers)
    n_env = r.num_env_workers
    fixed = ((n_pool * r.cpus_per_worker if r.cpus_per_worker is not None else 0.0)
             + (n_env * r.cpus_per_env_worker if r.cpus_per_env_worker is not None else 0.0))
    n_auto = (n_pool if r.cpus_per_worker is None else 0) + (n_env if r.cpus_per_env_worker is None else 0)
    share = 1.0
    if n_auto:
        share = min(1.0, math.floor((cluster_cpus - fixed) / n_auto / RAY_MIN_FRACTION) * RAY_MIN_FRACTION)
        share = round(share, 4)
    per_worker = r.cpus_per_worker if r.cpus_per_worker is not None else share
    per_env = r.cpus_per_env_worker if r.cpus_per_env_worker is not None else share
    need = n_pool * per_worker + n_env * per_env
    set_ = [k for k in ("cpus_per_worker", "cpus_per_env_worker") if getattr(r, k) is not None]
    cpus = (f"trainer.ray.num_cpus={r.num_cpus}" if r.num_cpus is not None else
            "trainer.ray.num_cpus=null: this machine's CPUs")
    if n_auto and share < RAY_MIN_FRACTION:
        raise ConfigError(
            f"trainer.ray: {' and '.join(f'trainer.ray.{k}={getattr(r, k):g}' for k in set_)} take {fixed:g} of the "
            f"local Ray cluster's {cluster_cpus:g} CPUs ({cpus}), leaving nothing for the other {n_auto} workers; "
            f"lower it, or set trainer.ray.num_cpus={math.ceil(fixed) + 1}")
    if need > cluster_cpus + 1e-9:
        raise ConfigError(
            f"trainer.ray: the workers need {need:g} CPUs ({n_policies} {'policy' if n_policies == 1 else 'policies'}"
            f" x {r.num_rollout_workers + r.num_update_workers} workers x trainer.ray.cpus_per_worker="
            f"{per_worker:g} + {n_env} environment workers x trainer.ray.cpus_per_env_worker={per_env:g}) but the "
            f"local Ray cluster has {cluster_cpus:g} ({cpus}); "
            + (f"lower or unset {' / '.join('trainer.ray.' + k for k in set_)} (null shares the CPUs), " if set_
               else "use fewer workers, ")
            + f"or set trainer.ray.num_cpus={max(math.ceil(need), 1)} (logical CPUs: more than the cores "
              f"oversubscribes them)")
    return per_worker, per_env


def _validate_ray_fit(r: RayConfig, n_policies: int) -> None:
    """Ray is installed and, for a local cluster, the workers fit in it: checked before any work."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("trainer.backend=ray needs Ray, which is not installed here: pip install -e '.[ray]'")
    if r.address:  # an existing cluster: Ray places the workers, or says why not, when they start
        return
    ray_cpu_shares(r, n_policies, local_ray_cpus(r))
    if r.gpus_per_worker > 0:
        import torch

        n_pool = n_policies * (r.num_rollout_workers + r.num_update_workers)
        need, have = n_pool * r.gpus_per_worker, torch.cuda.device_count() if torch.cuda.is_available() else 0
        if need > have + 1e-9:
            raise ConfigError(f"trainer.ray.gpus_per_worker={r.gpus_per_worker:g}: the {n_pool} rollout/update workers "
                              f"need {need:g} GPUs but this machine has {have}; lower it (fractions share a GPU), "
                              f"or 0 for CPU workers")


def _validate_tiny(cfg: Config) -> None:
    t = cfg.model.tiny
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"):
        if getattr(t, name) < 1:
            raise ConfigError(f"model.tiny.{name}={getattr(t, name)!r} must be an integer >= 1")
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
    from .envs import registry

    try:
        return registry.resolve(name)
    except registry.EnvError as e:
        raise ConfigError(f"env.name={name!r}: {e}") from None


_ENV_SET_BY_ATGRPO = {"style": "env.style", "split": "atgrpo (train and evaluation problems)"}


def _validate_env(cfg: Config) -> int:
    """``env.kwargs`` fit the environment: every key a parameter of its constructor, simple types as annotated,
    and the environment builds and resets once. Returns the number of policies the run will build."""
    import inspect

    from .envs import registry

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
            _coerce(simple[0], v, f"env.kwargs.{k}")
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
    return 1 if cfg.policy.sharing in ("L0", "L1") else len(env.agents)


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
            t = _coerce(float, spec["temperature"], f"{key}.temperature")
            if t <= 0:
                raise ConfigError(f"{key}.temperature={t!r} must be a finite number > 0 (0 would make all K "
                                  f"candidates identical)")
            spec["temperature"] = t
        if "max_new_tokens" in spec:
            m = _coerce(int, spec["max_new_tokens"], f"{key}.max_new_tokens")
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
    from .policies.hf import PRESETS, model_source_error  # local import: pulls in torch

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
    if m.gradient_checkpointing and cfg.algo.shared_prefix:
        raise ConfigError("model.gradient_checkpointing=true recomputes layers in the backward pass, where "
                          "algo.shared_prefix=true's attention (responses on their prompt's keys) is no longer in "
                          "place; set algo.shared_prefix=false with it")


def _validate_lora(cfg: Config) -> None:
    lora = cfg.policy.lora
    if not isinstance(lora.rank, int) or isinstance(lora.rank, bool) or lora.rank < 1:
        raise ConfigError(f"policy.lora.rank={lora.rank!r} must be an integer >= 1")
    _positive("policy.lora.alpha", lora.alpha)
    if not (isinstance(lora.dropout, (int, float)) and 0 <= lora.dropout < 1):
        raise ConfigError(f"policy.lora.dropout={lora.dropout!r} must be in [0, 1)")
    tm = lora.target_modules
    if not (isinstance(tm, str) and tm) and not (isinstance(tm, list) and tm and all(isinstance(x, str) for x in tm)):
        raise ConfigError(f"policy.lora.target_modules={tm!r} must be 'all-linear' or a list of module names")
