"""Model shapes for memory planning: the sizes of a Llama-style decoder, read from a ``config.json``, from
``model.tiny.*`` or from a built-in table, and the parameter counts that follow from them (the model, a LoRA
adapter). Pure: nothing is loaded (``plan_memory`` builds on it)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # LoRA "all-linear"


@dataclass(frozen=True)
class ModelShape:
    """The shape of a Llama-style decoder (Llama, Qwen2, Qwen3, SmolLM2, atgrpo's tiny model)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # the LM head is the embedding matrix (no parameters of its own)
    qk_norm: bool = False  # Qwen3: an RMSNorm of head_dim on each query and key head
    cascade: bool = True  # rollout and update use cascade attention (llama / qwen2 / qwen3, full attention)
    name: str = ""


BUILTIN_SHAPES = {  # as in the models' config.json (Qwen/Qwen3-1.7B, Qwen/Qwen3-8B)
    "qwen3-1.7b": ModelShape(2048, 28, 16, 8, 128, 6144, 151936, tied=True, qk_norm=True, name="Qwen3-1.7B"),
    "qwen3-8b": ModelShape(4096, 36, 32, 8, 128, 12288, 151936, tied=False, qk_norm=True, name="Qwen3-8B"),
}


def shape_from_hf_config(cfg: dict, name: str = "") -> ModelShape:
    """A ``ModelShape`` from the dict of a Hugging Face ``config.json`` (head_dim defaults to hidden / heads,
    kv heads to heads, as transformers does)."""
    heads = cfg["num_attention_heads"]
    layer_types = cfg.get("layer_types") or []
    cascade = (cfg.get("model_type") in ("llama", "qwen2", "qwen3") and not cfg.get("use_sliding_window", False)
               and all(t == "full_attention" for t in layer_types))  # as policies/cascade.supports
    return ModelShape(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                      kv_heads=cfg.get("num_key_value_heads") or heads,
                      head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                      intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                      tied=bool(cfg.get("tie_word_embeddings", True)), qk_norm=cfg.get("model_type") == "qwen3",
                      cascade=cascade, name=name or cfg.get("_name_or_path") or cfg.get("model_type", ""))


def read_hf_config(path: str) -> ModelShape:
    """The shape in a ``config.json`` file, or in the ``config.json`` of a model directory."""
    f = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(f, encoding="utf-8") as fh:
        return shape_from_hf_config(json.load(fh), name=os.path.basename(os.path.dirname(os.path.abspath(f))))


def tiny_shape(hidden: int, layers: int, heads: int, intermediate: int, vocab: int) -> ModelShape:
    """The built-in tiny Llama (``policies/tiny.py``): full multi-head attention, tied embeddings."""
    return ModelShape(hidden, layers, heads, heads, hidden // heads, intermediate, vocab, tied=True, name="tiny")


# ---- parameters ---------------------------------------------------------------------------------------------
def linear_shapes(s: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer (no biases: Llama / Qwen3 have none)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {"q_proj": (s.hidden, q), "k_proj": (s.hidden, kv), "v_proj": (s.hidden, kv), "o_proj": (q, s.hidden),
            "gate_proj": (s.hidden, s.intermediate), "up_proj": (s.hidden, s.intermediate),
            "down_proj": (s.intermediate, s.hidden)}


def num_params(s: ModelShape) -> int:
    """All parameters: embedding, per layer the seven linears and two RMSNorms (Qwen3: two more of head_dim),
    the final norm, and the LM head unless tied."""
    per_layer = sum(i * o for i, o in linear_shapes(s).values()) + 2 * s.hidden + (2 * s.head_dim if s.qk_norm else 0)
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.layers * per_layer + s.hidden


def lora_params(s: ModelShape, rank: int, target_modules="all-linear") -> int:
    """Parameters of one LoRA adapter: ``rank * (in + out)`` per targeted linear per layer. ``all-linear`` is
    every linear of the decoder layers (peft leaves the LM head out); a list names modules (``q_proj``...)."""
    targets = LINEARS if target_modules == "all-linear" else tuple(target_modules)
    unknown = [t for t in targets if t not in LINEARS]
    if unknown:
        raise ValueError(f"policy.lora.target_modules: cannot plan for {unknown}; known: {', '.join(LINEARS)}")
    return s.layers * sum(rank * (i + o) for name, (i, o) in linear_shapes(s).items() if name in targets)


def plan_shape(cfg, model: str | None = None, model_config: str | None = None) -> ModelShape:
    """The model shape to plan for: --model (built-in table), --model-config, model.tiny.*, or the config.json of
    the configured model directory (never the weights)."""
    from .config.schema import ConfigError

    if model:
        if model not in BUILTIN_SHAPES:
            raise ConfigError(f"--model {model!r} is not known; choose one of: {', '.join(BUILTIN_SHAPES)}")
        return BUILTIN_SHAPES[model]
    if model_config is None and cfg.model.kind == "tiny":
        from .policies.tokenizer import VOCAB_SIZE

        t = cfg.model.tiny
        return tiny_shape(t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size, VOCAB_SIZE)
    if model_config is None:
        from .policies.hub import cache_root

        model_config = (os.path.join(cache_root(), cfg.model.preset) if cfg.model.preset
                        else os.path.expanduser(cfg.model.path or ""))
    f = os.path.join(model_config, "config.json") if os.path.isdir(model_config) else model_config
    if not os.path.isfile(f):
        raise ConfigError(f"no config.json at {f!r} to plan with (a preset's is written by its first load, "
                          f"e.g. atgrpo eval CONFIG eval.problems=1); give --model-config PATH or --model "
                          f"{' | '.join(BUILTIN_SHAPES)}")
    return read_hf_config(f)
