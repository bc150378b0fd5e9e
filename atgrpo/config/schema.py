"""The config tree as dataclasses: one section per concern, every field typed.

Choices are ``Literal`` types and numeric ranges are field metadata (``at_least``, ``above``, ``within``), so one
generic check (``check_fields``) validates every field from its declaration; ``checks.py`` holds only the checks
that involve several fields or the machine.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from ..algorithms.names import Aggregation, GroupKey, KLEstimator


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and the valid choices."""


# ---- field ranges ----------------------------------------------------------------------------------------
def at_least(default: Any, lo: float, zero: str | None = None) -> Any:
    """A number >= ``lo``; ``zero``: what 0 means (said in the error)."""
    return field(default=default, metadata={"lo": lo, "zero": zero})


def above(default: Any, lo: float = 0) -> Any:
    """A number > ``lo``."""
    return field(default=default, metadata={"lo": lo, "lo_open": True})


def within(default: Any, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Any:
    """A number in the interval from ``lo`` to ``hi`` (open or closed at each end)."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open})


# ---- the sections --------------------------------------------------------------------------------------
Sharing = Literal["L0", "L1", "L2", "L3"]  # single agent | one shared policy | per-role LoRA | one model per role
DType = Literal["float32", "bfloat16", "float16"]
LoggingBackend = Literal["tensorboard", "wandb", "mlflow"]


@dataclass
class EnvConfig:
    name: str = "plan_path"
    style: str = "compact"  # compact (tiny policies) | chat (LLMs): the env's prompt styles
    kwargs: dict[str, Any] = field(default_factory=lambda: {"size": 5, "wall_prob": 0.2, "max_turns": 3})


@dataclass
class TinyConfig:
    hidden_size: int = at_least(128, 1)
    num_layers: int = at_least(4, 1)
    num_heads: int = at_least(4, 1)
    intermediate_size: int = at_least(384, 1)
    max_positions: int = at_least(512, 1)


@dataclass
class ModelConfig:
    kind: Literal["tiny", "hf"] = "tiny"  # tiny | hf (a local Hugging Face model directory in `path`, or a `preset`)
    path: str | None = None  # hf: a local model directory, or a hub id org/name (the Hugging Face cache; downloaded
    # unless HF_HUB_OFFLINE=1)
    revision: str | None = None  # hf, with a hub id: a branch, tag or commit (default main); pinned to its commit
    preset: str | None = None  # hf: a named model, e.g. smollm2-135m (see docs/models.md)
    gguf_file: str | None = None  # hf: a GGUF file in `path` (dequantized once, cached); with a preset, its file
    enable_thinking: bool = False  # hf: passed to the chat template (Qwen3's thinking mode; the paper: off)
    gradient_checkpointing: bool = False  # recompute each layer's activations in the backward pass (less memory)
    tiny: TinyConfig = field(default_factory=TinyConfig)
    dtype: DType = "float32"  # float32 on CPU; bfloat16 on GPU
    # auto | float32 | bfloat16 (float32 master weights): bfloat16 runs the update and the warm start under
    # torch.autocast and samples rollouts from a bfloat16 copy of each policy; auto picks bfloat16 for hf models on
    # CPUs with native bfloat16 units (AMX, AVX512-BF16), float32 elsewhere. Resolved at start-up and recorded in
    # config.yaml. docs/models.md, "Precision and memory"
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    # bfloat16: forward/backward under torch.autocast on the weights of `dtype`, without a rollout copy (the
    # lower-level switch; model.precision=bfloat16 sets it); the LM head stays in the weights' dtype
    autocast: Literal["none", "bfloat16"] = "none"
    device: str = "cpu"
    max_prompt_tokens: int = at_least(1024, 1)


@dataclass
class LoRAConfig:
    rank: int = at_least(16, 1)
    alpha: float = above(32.0)
    target_modules: Any = "all-linear"  # "all-linear" (every linear layer but the LM head) or a list of names
    dropout: float = within(0.0, 0, 1, hi_open=True)


@dataclass
class PolicyConfig:
    sharing: Sharing = "L1"  # L0 single agent | L1 one shared policy | L2 per-role LoRA | L3 one model per role
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # L2: one adapter per role on one frozen base model
    # L2 / L3: which roles share a policy, {policy: [roles]}, e.g. {a: [tool, verifier], b: [reasoner]}; every role
    # in exactly one group. Empty (the default): one policy per role, named by the role
    groups: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class VLLMConfig:
    """``rollout.engine=vllm`` (docs/models.md, "The vLLM engine"): where and how the engine process runs."""

    python: str | None = None  # the Python that has vLLM (null: $ATGRPO_VLLM_PYTHON, else this interpreter)
    gpu_memory_utilization: float = within(0.5, 0, 1, lo_open=True)  # GPU: the share of its memory vLLM may claim
    kv_cache_gb: float = above(1.0)  # CPU: the KV cache size in GiB (set explicitly, vLLM skips its RAM-share check)
    cpu_threads: str | None = None  # CPU: cores for vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND, e.g. 0-1)
    max_model_len: int = at_least(0, 0, zero="prompt + response budget")  # model.max_prompt_tokens + max_new_tokens
    startup_timeout_s: float = above(900.0)


@dataclass
class RolloutConfig:
    mode: Literal["tree", "trajectory"] = "tree"  # tree (AT-GRPO) | trajectory (K independent episodes per problem)
    K: int = at_least(8, 1)
    problems_per_step: int = at_least(16, 1)
    temperature: float = at_least(1.0, 0)
    max_new_tokens: int = at_least(12, 1)
    engine: Literal["native", "vllm"] = "native"  # native (atgrpo/engine: cascade decoding) | vllm (model.kind=hf)
    cuda_graphs: bool = True  # native engine on a GPU: replay each decoding step as a captured CUDA graph
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    # a role's own sampling, over the values above: {coder: {max_new_tokens: 1024}, tester: {max_new_tokens: 128,
    # temperature: 0.8, stop: ["</test>"]}}; the loss scores each sample at the temperature it was drawn at
    per_agent: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgoConfig:
    alpha: float = 1.0  # reward = alpha * team + local
    group_key: GroupKey = "problem_turn_agent"
    std_normalize: bool = True
    filter_zero_variance: bool = True
    clip_low: float = at_least(0.2, 0)
    clip_high: float = at_least(0.2, 0)
    aggregation: Aggregation = "token-mean"
    kl_coef: float = at_least(0.0, 0)
    kl_estimator: KLEstimator = "k3"
    lr: float = above(2e-4)
    # optimizer steps over which the lr rises linearly to ``lr`` (per policy; 0: constant from the first step).
    # AdamW's first step moves every weight by about lr whatever its gradient's size; long programs break under it
    warmup_steps: int = at_least(0, 0, zero="constant lr")
    weight_decay: float = at_least(0.0, 0)
    grad_clip: float = above(1.0)
    minibatches: int = at_least(2, 1)  # optimizer steps per policy per train step (one PPO epoch)
    micro_batch_size: int = at_least(256, 1)  # sequences per forward/backward (gradient accumulation in a mini-batch)
    shared_prefix: bool = True  # run each distinct prompt once in the loss, K responses on its KV cache (exact)
    update_token_budget: int = at_least(16384, 1)  # shared_prefix: padded tokens per forward/backward


@dataclass
class WarmStartConfig:
    enabled: bool = True
    episodes: int = at_least(350, 0)  # scripted episodes on training problems
    noise: float = at_least(0.3, 0)  # expert corruption: each answer character replaced (typed answers), or one bug
    epochs: int = at_least(2, 0)
    lr: float = above(1e-3)
    batch_size: int = at_least(64, 1)  # demonstrations per optimizer step
    token_budget: int = at_least(16384, 1)  # padded tokens per forward/backward (a batch is split to fit: real models)
    # optimizer steps of linear lr warm-up; the lr also decays linearly to 0.1x over the warm start, so a warm start
    # of few steps (real models: 8-12) under the default never reaches warmstart.lr (peak 0.15x at 10 steps)
    warmup_steps: int = at_least(20, 1)
    # L2/L3: one warm start on every role's demonstrations, copied to every policy (all roles start from one
    # checkpoint, as in the paper from one pretrained model); false: each policy on its own roles' demonstrations
    common: bool = True
    # what each demonstration trains the policy on: ``noisy``, the answer as played (mistakes included), or
    # ``expert``, the expert's answer in the same state while the episode goes on with the noisy one, so the
    # noise only makes the states to recover from (a mistake exposed, a wrong program to revise) and no
    # mistake is imitated
    imitate: Literal["noisy", "expert"] = "noisy"


@dataclass
class EvalConfig:
    problems: int = at_least(200, 1)  # held-out problems (evaluation split)
    temperature: float = at_least(0.0, 0)  # 0 = greedy
    every: int = at_least(10, 0, zero="only before and after training")  # also evaluate every N steps


@dataclass
class TrainConfig:
    """The training loop: its length, checkpoints, outputs and CPU threads."""

    steps: int = at_least(40, 0)
    dump_rollouts: list[int] = field(default_factory=list)  # steps to dump; empty = first and last
    tensorboard: bool = True
    plot: bool = True
    checkpoint_every: int = at_least(10, 0, zero="only at the end")  # steps between checkpoints (and on a stop signal)
    keep_checkpoints: int = at_least(2, 1)  # step checkpoints kept (the newest ones); checkpoint/final is always kept
    max_nonfinite: int = at_least(3, 1)  # stop with an error after this many skipped non-finite updates
    threads: int = at_least(0, 0, zero="OMP_NUM_THREADS, else the free cores")  # torch CPU threads (0: OMP_NUM_THREADS
    # if set, else the cores free now: usable cores minus the load average, at least 1; atgrpo/threads.py). The
    # choice is printed and written to config.yaml


@dataclass
class RayConfig:
    """Placement of the Ray backend (docs/ray.md). Workers are Ray actors; each policy has a placement group
    holding its rollout and update workers."""

    address: str | None = None  # an existing cluster ("auto", "ray://head:10001"); None: start a local one
    num_cpus: int | None = at_least(None, 1)  # local cluster only: logical CPUs it offers (None: what Ray detects)
    num_rollout_workers: int = at_least(1, 1)  # per policy: inference actors (1 keeps the local backend's random stream)
    num_update_workers: int = at_least(1, 1)  # per policy: data-parallel optimisation actors (torch.distributed)
    update_sharding: Literal["replicate", "fsdp"] = "replicate"  # the update workers of a policy: a full replica
    # each, gradients all-reduced | FSDP2 shards of one model (docs/performance.md); only with num_update_workers > 1
    num_env_workers: int = at_least(2, 1)  # CPU actors that step environments (and run their sandboxed code)
    cpus_per_worker: float | None = None  # CPUs reserved per rollout / update worker (in its policy's placement
    # group); None: a local cluster's CPUs shared by all workers (at most 1 each), 1 on an existing cluster
    gpus_per_worker: float = at_least(0.0, 0)  # GPUs reserved per rollout / update worker (> 0: model on cuda, NCCL)
    cpus_per_env_worker: float | None = None  # CPUs reserved per environment worker (None: as cpus_per_worker)
    env_retries: int = at_least(3, 0)  # resubmissions of one environment task after its worker died
    max_failures: int = at_least(3, 0, zero="no recovery: the run stops at the first")  # rollout/update worker or
    # node losses the run recovers from (rebuild the pools, restore the last checkpoint, redo the steps since)
    placement: Literal["pack", "spread"] = "pack"  # each policy's pool: on as few nodes as fit | over the nodes
    pool_resources: dict[str, dict[str, float]] = field(default_factory=dict)  # policy -> custom node resources
    # each of its workers reserves (e.g. {plan: {gpu_a: 0.01}}: the pool goes to nodes offering gpu_a); needs address


@dataclass
class SystemConfig:
    """The training system: where rollouts, environment steps and updates run."""

    backend: Literal["local", "ray"] = "local"  # local (everything in this process) | ray (actors, many machines)
    ray: RayConfig = field(default_factory=RayConfig)


@dataclass
class LoggingConfig:
    """Where metrics go besides metrics.jsonl (the same names everywhere); the resolved config is logged as the
    run's parameters. wandb and mlflow are extras: pip install -e '.[wandb]' / '.[mlflow]'."""

    backends: list[LoggingBackend] = field(default_factory=lambda: ["tensorboard"])  # any of these three
    project: str = "atgrpo"  # the wandb project and the mlflow experiment
    run_name: str | None = None  # null: the run directory's name
    wandb_mode: Literal["offline", "online"] = "offline"  # offline (files in RUN_DIR/wandb, `wandb sync` later)
    mlflow_tracking_uri: str | None = None  # null: a file store in the run directory, file:RUN_DIR/mlruns


@dataclass
class SandboxConfig:
    """The sandbox that runs the programs agents write (atgrpo.sandbox; docs/reliability.md)."""

    unconfined: bool = False  # where nothing can isolate programs (no namespaces), run them anyway, unconfined


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
    system: SystemConfig = field(default_factory=SystemConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


LOGGING_BACKENDS = typing.get_args(LoggingBackend)


def coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the field's type and convert where it is safe, naming the key on failure.

    YAML 1.1 reads ``1e-4`` as a string: float fields take numeric strings. Integer fields take only integers
    (``2.5`` and ``abc`` are errors, never truncated); bool fields only true/false; every float is finite."""
    if typing.get_origin(hint) is Literal:  # a choice: its type is the choices' type, the check_fields' business
        hint = type(typing.get_args(hint)[0])
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
        return [coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping, e.g. {{a: 1}}")
        return value
    return value  # Any: checked by its own validator


# ---- the generic check ---------------------------------------------------------------------------------
def check_fields(obj: Any, path: str = "") -> None:
    """Every field of the tree against its declaration: a ``Literal`` value is one of its choices (also in
    lists), a number within its metadata range. Raises ``ConfigError`` naming the dotted key."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        key, value = f"{path}.{f.name}" if path else f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, key)
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) is list and isinstance(value, list):
            (item,) = typing.get_args(hint)
            for i, v in enumerate(value):
                _check_choice(item, v, f"{key}[{i}]")
        else:
            _check_choice(hint, value, key)
        if "lo" in f.metadata and value is not None:
            _check_range(f.metadata, value, key, int in _plain_types(hint))


def _plain_types(hint: Any) -> tuple:
    return tuple(a for a in (typing.get_args(hint) or (hint,)) if a is not type(None))


def _check_choice(hint: Any, value: Any, key: str) -> None:
    if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: "
                          f"{', '.join(map(str, typing.get_args(hint)))}")


def _check_range(meta: dict[str, Any], value: Any, key: str, integer: bool) -> None:
    lo, hi = meta["lo"], meta.get("hi")
    lo_open, hi_open = meta.get("lo_open", False), meta.get("hi_open", False)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > lo if lo_open else value >= lo)
          and (hi is None or (value < hi if hi_open else value <= hi)))
    if ok:
        return
    if hi is not None:
        raise ConfigError(f"{key}={value!r} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")
    what = "an integer" if integer else "a finite number"
    zero = f" (0: {meta['zero']})" if meta.get("zero") else ""
    raise ConfigError(f"{key}={value!r} must be {what} {'>' if lo_open else '>='} {lo:g}{zero}")
