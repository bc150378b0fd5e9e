"""Memory planning: how many bytes each model of a run holds at its peak, term by term, from the config alone.

Pure functions of a model's shape (``model_shapes.ModelShape``: read from a ``config.json``, from
``model.tiny.*`` or from the built-in table) and the run's settings (``RunSettings``); nothing is loaded or allocated. ``atgrpo
plan-memory`` (``cli.py``) prints the result (``plan_report.py``). Every term counts what *this* code materialises, and its
docstring says why; the planner was checked against measured peaks on the CPU (docs/models.md, "Memory
planning").

One "model" is one copy of weights in memory: L0/L1 one shared model, L3 one per role, L2 one frozen base
carrying every role's LoRA adapter. A model's peak is

    weights + optimizer + max(update: grads + activations, rollout: kv_cache + sampling) + runtime

because rollout and update take turns: the rollout's KV cache is gone before the update starts, and the
update sets the gradients to None when it ends (``trainer/update.py``), while weights and AdamW states stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model_shapes import (BUILTIN_SHAPES, ModelShape, linear_shapes, lora_params, num_params, plan_shape,
                           read_hf_config, shape_from_hf_config, tiny_shape)

# the shapes' part of the planner (``model_shapes``) is re-exported: ``plan_memory`` is the one entry point
__all__ = ["BUILTIN_SHAPES", "DTYPE_BYTES", "GIB", "GpuFit", "HEAD_CHUNK_BYTES", "MicroBatch", "ModelPlan",
           "ModelShape", "RUNTIME_GB", "RunSettings", "act_bytes", "activation_bytes", "autocast_weight_bytes",
           "budget_fill", "fit_gpus", "head_chunk_rows", "kv_cache_bytes", "layer_activation_elements", "layer_bytes",
           "logits_bytes", "lora_params", "micro_batch", "num_params", "plan", "plan_shape", "read_hf_config",
           "packed_bytes", "response_attention_bytes", "runtime_bytes", "sampler_bytes", "sampling_bytes",
           "settings_from_config", "shape_from_hf_config", "tiny_shape"]

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RUNTIME_GB = {"cpu": 0.0, "cuda": 1.0}  # see ``runtime_bytes``
HEAD_CHUNK_BYTES = 64 * 2**20  # float32 logits of one chunk of positions in the fused LM head (policies/logprobs.py)


# ---- the run's settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    """What the plan needs from the config (``from_config``), with lengths that may be set apart from it."""

    sharing: str = "L1"  # L0 | L1 | L2 | L3
    roles: int = 2  # policy ids: L3 one model each, L2 one adapter each
    dtype: str = "float32"  # model.dtype: weights, grads, AdamW states (and activations, KV cache)
    compute_dtype: str | None = None  # model.autocast=bfloat16: activations and KV cache in bfloat16
    lora_rank: int = 16
    lora_targets: object = "all-linear"
    K: int = 8
    problems: int = 16  # rollout.problems_per_step: prompts of one generate call
    prompt_tokens: int = 1024  # the longest prompt (model.max_prompt_tokens, the worst case)
    new_tokens: int = 12  # rollout.max_new_tokens
    micro_batch_size: int = 256  # sequences per forward/backward
    token_budget: int = 16384  # algo.update_token_budget (shared prefix)
    shared_prefix: bool = True
    gradient_checkpointing: bool = False
    kl_reference: bool = False  # algo.kl_coef > 0: a frozen deep copy of each policy
    device: str = "cpu"
    rollout_copy: bool = False  # precision bfloat16 on float32 weights: rollouts sample from a bfloat16 copy
    packed_weights: bool = False  # the native engine on the CPU: its linear weights prepacked for oneDNN


def settings_from_config(cfg, roles: int, prompt_tokens: int | None = None, new_tokens: int | None = None
                         ) -> RunSettings:
    """``RunSettings`` of an atgrpo ``Config``; ``prompt_tokens`` / ``new_tokens`` replace the configured maxima
    (e.g. with the lengths a run really sees)."""
    from .hardware import resolve_precision  # model.precision=auto: as the run would resolve it on this machine

    autocast = getattr(cfg.model, "autocast", "none")
    bf16 = resolve_precision(cfg.model, cfg.system.backend)[0] == "bfloat16" and cfg.model.dtype == "float32"
    if bf16:  # float32 master weights under bfloat16 autocast (policies/precision.py)
        autocast = "bfloat16"
    copy = bf16 and cfg.system.backend == "local"  # the local backend's rollout copies (trainer/backend.py)
    device = str(cfg.model.device).split(":")[0]
    return RunSettings(
        sharing=cfg.policy.sharing, roles=roles, dtype=cfg.model.dtype,
        compute_dtype=None if autocast in (None, "none") else autocast, lora_rank=cfg.policy.lora.rank,
        lora_targets=cfg.policy.lora.target_modules, K=cfg.rollout.K, problems=cfg.rollout.problems_per_step,
        prompt_tokens=prompt_tokens or cfg.model.max_prompt_tokens,
        new_tokens=new_tokens or cfg.rollout.max_new_tokens, micro_batch_size=cfg.algo.micro_batch_size,
        token_budget=cfg.algo.update_token_budget, shared_prefix=cfg.algo.shared_prefix,
        gradient_checkpointing=cfg.model.gradient_checkpointing, kl_reference=cfg.algo.kl_coef > 0,
        device=device, rollout_copy=copy,
        packed_weights=device == "cpu" and cfg.rollout.engine == "native" and cfg.policy.sharing != "L2")


def act_bytes(r: RunSettings) -> int:
    """Bytes per element of activations and the KV cache: the autocast dtype, else the model's."""
    return DTYPE_BYTES[r.compute_dtype or r.dtype]


# ---- the micro-batch of the update --------------------------------------------------------------------------
@dataclass(frozen=True)
class MicroBatch:
    """The largest forward/backward of the update: ``groups`` distinct prompts of ``prompt`` tokens, ``rows``
    responses of ``response`` tokens; ``tokens`` run through the layers, ``logit_rows`` reach the LM head."""

    groups: int
    rows: int
    prompt: int
    response: int
    tokens: int
    logit_rows: int


def micro_batch(r: RunSettings) -> MicroBatch:
    """A full micro-batch as ``update.micro_batches`` packs it, every prompt and response at its maximum length.

    Shared prefix (``shared_prefix.plan_chunks``): whole groups of K responses, each costing
    ``P + K * (M - 1)`` padded tokens, as many as ``token_budget`` and ``micro_batch_size`` allow (a group too
    big alone is split into sub-groups of ``(budget - P) // (M - 1)`` rows); one packed forward runs
    ``G * P + R * (M - 1)`` tokens and takes logits at ``G + R * (M - 1)`` positions. Without shared prefix
    (``response_logprobs``): ``micro_batch_size`` sequences of ``P + M`` tokens, logits at the ``M + 1`` last
    positions of each (each target read where it is: no gathered copy)."""
    P, M, K = r.prompt_tokens, r.new_tokens, r.K
    if not r.shared_prefix:
        B = r.micro_batch_size
        return MicroBatch(B, B, P, M, B * (P + M), B * (M + 1))
    group = P + K * (M - 1)
    if group <= r.token_budget:
        rows = min(r.micro_batch_size, max(1, r.token_budget // group) * K)
        groups = math.ceil(rows / K)
    else:
        rows, groups = max(1, min(r.micro_batch_size, K, (r.token_budget - P) // max(1, M - 1))), 1
    return MicroBatch(groups, rows, P, M, groups * P + rows * (M - 1), groups + rows * (M - 1))


# ---- the terms ----------------------------------------------------------------------------------------------
def layer_activation_elements(s: ModelShape) -> int:
    """Elements autograd keeps per token per decoder layer in the compute dtype (transformers' Llama / Qwen3
    attention, the norms and MLP of ``policies/lean_layers.py``, our attention):

    - the two RMSNorms' outputs, one copy each that the linears reading it share: ``2 * hidden``;
    - attention: the rotated query and key, the value, and the attention output (kept by ``o_proj``);
      Qwen3's per-head query/key norms keep their inputs, one more query and key;
    - MLP: gate and up (kept by SwiGLU) and their product (kept by ``down_proj``): ``3 * intermediate``.
    Residual adds and views keep nothing; the norms' inputs are in ``layer_bytes``."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = 2 * q + 2 * kv + (q + kv if s.qk_norm else 0)
    return 2 * s.hidden + attn + 3 * s.intermediate


def layer_bytes(s: ModelShape, r: RunSettings) -> int:
    """Bytes kept per token per decoder layer: ``layer_activation_elements`` in the compute dtype, and each
    RMSNorm's input (the residual stream, in the weights' dtype: float32 under autocast) with one float32
    reciprocal RMS."""
    return 2 * (s.hidden * DTYPE_BYTES[r.dtype] + 4) + layer_activation_elements(s) * act_bytes(r)


def response_attention_bytes(s: ModelShape, mb: MicroBatch, b: int) -> int:
    """Extra bytes per *response* token per layer with shared prefix (``cascade.two_part_attention`` with
    gradients): the query in the two stacked layouts the two parts read (copies) and the merged output, in the
    activation dtype, and one float32 log-sum-exp per head. No scores: the backward recomputes them block by block
    from the kept log-sum-exp (``policies/attention_part.py``). The prompts' own attention is a fused kernel that
    keeps no scores either. ``b``: bytes of an activation. ``mb`` is unused (the term no longer grows with the
    prompt): kept so the planner's terms share one signature."""
    return 3 * s.heads * s.head_dim * b + 4 * s.heads


def head_chunk_rows(s: ModelShape) -> int:
    """Positions per chunk of the fused LM head (``logprobs.head_logprobs``): ``HEAD_CHUNK_BYTES`` of float32
    logits, at least 16."""
    return max(16, HEAD_CHUNK_BYTES // (4 * s.vocab))


def logits_bytes(s: ModelShape, mb: MicroBatch, r: RunSettings | None = None) -> int:
    """The LM head fused into the log-probs (``logprobs.head_logprobs``): at most one chunk of positions'
    float32 logits is alive in the forward with its log-sum-exp's temporary (``2 * chunk * vocab * 4``; the
    backward walks the chunk a block of the vocabulary at a time, less), plus one float32 log-sum-exp per position
    the loss reads (``logit_rows * 4``). The head weight's gradient is summed in float32: in place for float32
    weights; under autocast the backward's matmuls read a bfloat16 copy of the weight (``2`` bytes per head
    parameter); for bfloat16 weights a float32 sum (``4``). Each block's product is a small temporary."""
    rows = min(mb.logit_rows, head_chunk_rows(s))
    per_param = 0
    if r is not None and r.dtype != "float32":
        per_param = 4
    elif r is not None and r.compute_dtype and r.compute_dtype != r.dtype:
        per_param = DTYPE_BYTES[r.compute_dtype]
    return 2 * rows * s.vocab * 4 + 4 * mb.logit_rows + per_param * s.vocab * s.hidden


def autocast_weight_bytes(s: ModelShape, r: RunSettings) -> int:
    """Under ``model.autocast`` on weights of another dtype (float32): the bfloat16 copies of one decoder layer's
    linear weights, which its backward casts again (``lean_layers.LinearFunction`` keeps the float32 weights, not
    autocast's copies of every layer's)."""
    if not r.compute_dtype or r.compute_dtype == r.dtype:
        return 0
    return sum(i * o for i, o in linear_shapes(s).values()) * DTYPE_BYTES[r.compute_dtype]


def activation_bytes(s: ModelShape, r: RunSettings) -> int:
    """Peak activation memory of the update's largest forward/backward (``micro_batch``):

    kept activations of every layer (``layer_bytes`` x tokens, plus ``response_attention_bytes`` x response
    tokens), the final norm (its input and output, ``2 * hidden`` per token in the weights' dtype), the logits
    (``logits_bytes``), and one layer's worth again for the gradients the backward makes while it walks through a
    layer; under autocast ``autocast_weight_bytes``. With gradient checkpointing each layer keeps only its input
    (``hidden`` per token) and the one layer being recomputed holds its full set.

    With shared prefix the packer fills a micro-batch up to ``token_budget`` with groups of any length, so shorter
    groups join the longest one (a Plan-Path tool group of 2,420 tokens and a plan group of 1,092 under a budget of
    4,096): every per-token term is scaled by ``budget_fill`` to a full budget, in the longest group's
    proportions."""
    mb, b = micro_batch(r), act_bytes(r)
    fill = budget_fill(r, mb)
    resp_tokens = mb.rows * (mb.response - 1)
    attn = resp_tokens * response_attention_bytes(s, mb, b) if r.shared_prefix else 0
    one_layer = fill * (mb.tokens * layer_bytes(s, r) + attn)
    residual = DTYPE_BYTES[r.dtype]  # the residual stream and the norms: the weights' dtype (float32 under autocast)
    tokens = fill * mb.tokens
    kept = s.layers * (tokens * s.hidden * residual) if r.gradient_checkpointing else s.layers * one_layer
    head = logits_bytes(s, mb, r) + 4 * (fill - 1) * mb.logit_rows  # the log-sum-exps of the filled positions
    return int(kept + one_layer + 2 * tokens * s.hidden * residual + head + autocast_weight_bytes(s, r))


def budget_fill(r: RunSettings, mb: MicroBatch) -> float:
    """How many of the longest micro-batch (``micro_batch``) a full ``token_budget`` holds when shorter groups fill
    the rest (shared prefix; at most ``micro_batch_size`` responses): ``>= 1``, and 1 without shared prefix or when
    one group alone exceeds the budget."""
    if not r.shared_prefix or mb.tokens >= r.token_budget:
        return 1.0
    return max(1.0, min(r.token_budget / mb.tokens, r.micro_batch_size / mb.rows))


def kv_cache_bytes(s: ModelShape, r: RunSettings) -> int:
    """The rollout's KV cache: keys and values (``2 * kv_heads * head_dim`` per token per layer, model dtype) of
    one ``generate`` call over every problem of the step with K branches. Cascade attention
    (``kv_cache.CascadeCache``) keeps each prompt once and reserves ``M`` own tokens per branch:
    ``problems * (P + K * M)`` tokens; otherwise (``ReservedCache``) every branch holds its prompt:
    ``problems * K * (P + M)``."""
    per_token = s.layers * 2 * s.kv_heads * s.head_dim * act_bytes(r)
    P, M = r.prompt_tokens, r.new_tokens
    tokens = r.problems * (P + r.K * M) if s.cascade else r.problems * r.K * (P + M)
    return tokens * per_token


def sampling_bytes(s: ModelShape, r: RunSettings) -> int:
    """The rollout's working memory besides the cache: the prefill of ``problems`` prompts (no gradients: one
    layer's live tensors at a time, the residual stream, the normalised input and the MLP's gate, up and
    product, ``(2 * hidden + 3 * intermediate)`` per token) and each decode step's float32 logits, log-softmax
    and probabilities for ``problems * K`` branches."""
    prefill = r.problems * r.prompt_tokens * (2 * s.hidden + 3 * s.intermediate) * act_bytes(r)
    return prefill + 3 * r.problems * r.K * s.vocab * 4


def sampler_bytes(s: ModelShape, r: RunSettings) -> int:
    """The copy the rollout samples from (``rollout_copy``, ``policies/rollout_copy.py``), beside the trainer's
    weights: every linear layer in bfloat16, the embedding and the LM head in float32 (the head's highest logits
    are recomputed in float32) and the head once more in bfloat16 (the ranking). The norms (a few thousand
    parameters) are counted as linear weights. Its trained weights are freed while the update runs
    (``ModelPlan.held_sampler``)."""
    if not r.rollout_copy:
        return 0
    P, head = num_params(s), s.vocab * s.hidden
    embeddings = head * (1 if s.tied else 2)  # the input embedding and the LM head (one tensor when tied)
    return (P - embeddings) * 2 + embeddings * 4 + head * 2


def packed_bytes(s: ModelShape, r: RunSettings) -> int:
    """The native engine's weights on the CPU (``packed_weights``, ``engine/weights.py``): every linear layer and
    the LM head again in oneDNN's blocked layout, in the dtype it samples in. Made when a rollout starts and freed
    before the update (``DecoderWeights.release``): a rollout-phase term."""
    if not r.packed_weights:
        return 0
    P, head = num_params(s), s.vocab * s.hidden
    return (P - head * (1 if s.tied else 2) + head) * (2 if r.rollout_copy else DTYPE_BYTES[r.dtype])


def runtime_bytes(device: str) -> int:
    """A constant per process and device that no tensor accounts for: on CUDA the context, cuBLAS workspaces and
    the caching allocator's slack (``RUNTIME_GB["cuda"]``, 1 GiB); on the CPU 0, as the measured growth over the
    RSS after imports needed none (docs/models.md)."""
    return int(RUNTIME_GB.get(device, 0.0) * GIB)


@dataclass(frozen=True)
class ModelPlan:
    """The terms (bytes) of one model in memory; ``name`` says which roles it serves."""

    name: str
    params: int
    trainable: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    kv_cache: int
    sampling: int
    runtime: int
    reference: int = 0  # the KL reference's frozen copies (algo.kl_coef > 0)
    sampler: int = 0  # the rollout's copy of the weights (``sampler_bytes``)
    packed: int = 0  # the CPU engine's packed weights, rollout phase only (``packed_bytes``)

    @property
    def held_sampler(self) -> int:
        """The part of the rollout copy held through the update: none when every weight trains (the trainer frees
        the copy for the update, ``RolloutCopies.release``); L2's frozen base's copy else."""
        return 0 if self.trainable == self.params else self.sampler

    @property
    def update(self) -> int:
        return self.grads + self.activations

    @property
    def rollout(self) -> int:
        return self.kv_cache + self.sampling + self.packed + self.sampler - self.held_sampler

    @property
    def peak(self) -> int:
        return (self.weights + self.reference + self.held_sampler + self.optimizer + max(self.update, self.rollout)
                + self.runtime)

    def dominant(self) -> str:
        terms = {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                 "activations": self.activations, "kv_cache": self.kv_cache, "sampling": self.sampling}
        return max(terms, key=terms.get)


def plan(s: ModelShape, r: RunSettings) -> list[ModelPlan]:
    """One ``ModelPlan`` per model in memory.

    - weights: every parameter in ``model.dtype``; L2 adds each role's adapter in float32 (peft keeps adapters
      in float32 whatever the base's dtype).
    - grads: one gradient per trainable parameter, in its dtype (L2: one role's adapter at a time; the update
      frees the gradients of a role before the next role's update).
    - optimizer: AdamW's two moments per trainable parameter, in its dtype (L2: every role's, they persist).
    - reference (``algo.kl_coef > 0``): ``copy.deepcopy`` of each policy (``trainer/run.py``); for L2 a role's
      policy is a view of the one model, so each role's copy is the whole base with every adapter.
    """
    P, b = num_params(s), DTYPE_BYTES[r.dtype]
    act, kv, smp, rt = activation_bytes(s, r), kv_cache_bytes(s, r), sampling_bytes(s, r), runtime_bytes(r.device)
    sampler, packed = sampler_bytes(s, r), packed_bytes(s, r)
    if r.sharing == "L2":
        lora = lora_params(s, r.lora_rank, r.lora_targets)
        weights = P * b + r.roles * lora * 4
        return [ModelPlan(f"base + {r.roles} adapters", P + r.roles * lora, lora, weights, lora * 4,
                          r.roles * lora * 8, act, kv, smp, rt, r.roles * weights if r.kl_reference else 0, sampler,
                          packed)]
    n = r.roles if r.sharing == "L3" else 1
    names = [f"role {i + 1}" for i in range(n)] if n > 1 else ["shared"]
    ref = P * b if r.kl_reference else 0
    return [ModelPlan(name, P, P, P * b, P * b, 2 * P * b, act, kv, smp, rt, ref, sampler, packed)
            for name in names]


@dataclass(frozen=True)
class GpuFit:
    """How a run fits GPUs of ``gpu_bytes``.

    - Local backend: every model on ``model.device``, one GPU: every model's weights and optimizer, the largest
      transient (rollout or update: models take turns), one runtime.
    - Ray backend with ``system.ray.gpus_per_worker=1``: one pool per policy (L2: per role, each worker rebuilding
      the base with every adapter), each with ``rollout_workers`` rollout workers (weights + runtime + their
      share of the rollout: the problems of a step are split among them, and the KV cache and prefill with them)
      and one update worker (weights + its optimizer + update + runtime), each on a GPU of its own. An update
      worker that does not fit one GPU (L1/L3) is split into ``update_workers`` FSDP ranks
      (``system.ray.update_sharding=fsdp``): each holds 1/n of the weights, gradients and AdamW moments, and
      the whole activations of its micro-batch (the full weights of one layer at a time are all-gathered: not
      counted), plus the runtime and a full KL reference.
    None where a worker cannot fit one GPU even so (rollout workers hold full weights)."""

    local_bytes: int
    local_fits: bool
    pools: int
    rollout_workers: int | None  # per pool
    rollout_worker_bytes: int  # each, with that many workers
    update_worker_bytes: int  # each
    ray_gpus: int | None  # pools * (rollout_workers + update_workers)
    update_workers: int = 1  # per pool: > 1 means FSDP ranks (system.ray.update_sharding=fsdp)


def fit_gpus(plans: list[ModelPlan], r: RunSettings, gpu_bytes: int) -> GpuFit:
    """The GPUs of ``gpu_bytes`` a run needs on each backend (``GpuFit``)."""
    released = sum(p.sampler - p.held_sampler for p in plans)  # every model's copy is back for the rollout
    local = (sum(p.weights + p.reference + p.held_sampler + p.optimizer for p in plans)
             + max(max(p.update for p in plans), released + max(p.kv_cache + p.sampling + p.packed for p in plans))
             + max(p.runtime for p in plans))
    pools = r.roles if r.sharing == "L2" else len(plans)
    share = r.roles if r.sharing == "L2" else 1  # an L2 update worker holds one role's optimizer
    fixed = max(p.weights + p.runtime for p in plans)  # Ray's rollout workers sample from their own weights
    rollout = max(p.rollout for p in plans)
    n = math.ceil(rollout / (gpu_bytes - fixed)) if gpu_bytes > fixed else None
    n = None if n is None or n > r.problems else max(1, n)
    update = max(p.weights + p.reference // share + p.optimizer // share + p.update + p.runtime for p in plans)
    shards = 1
    if update > gpu_bytes and r.sharing != "L2":  # FSDP: the sharded state over as many ranks as it takes
        state = max(p.weights + p.grads + p.optimizer for p in plans)
        room = gpu_bytes - max(p.activations + p.runtime + p.reference for p in plans)
        if room > 0:
            shards = math.ceil(state / room)
            update = max(math.ceil((p.weights + p.grads + p.optimizer) / shards) + p.activations + p.runtime
                         + p.reference for p in plans)
    ok = n is not None and update <= gpu_bytes
    return GpuFit(local, local <= gpu_bytes, pools, n, fixed + math.ceil(rollout / (n or 1)), update,
                  pools * (n + shards) if ok else None, shards)
