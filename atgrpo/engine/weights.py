"""The decoder's view of a transformers Llama / Qwen2 / Qwen3 model: each layer's weights, fused and cast once.

A decoding step of a small model at a few dozen rows is bound by the fixed cost of each operation and by reading
its weights, not by its arithmetic. So the step runs as few operations as it can: per layer one matmul for the
query, key and value projections (their weights concatenated, ``qkv``) and one for the MLP's gate and up
projections (``gate_up``). And on the CPU every weight is prepacked once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, as vLLM's CPU backend and torch's own frozen graphs do): a plain
``F.linear`` repacks its weight at every call, which at 16 rows costs about as much as the matmul
(``benchmarks/packed_linear_cost.py``; docs/performance.md).

The packed weights are copies, made once and made again only when a source weight has changed: every in-place
write to a tensor (the optimizer's step, a rollout copy's refresh, ``load_state_dict``) bumps its version
counter, and ``DecoderWeights.current`` compares the versions (and identities) it was built from.

The linear layers compute in the weights' dtype, or the model's autocast dtype when it runs under
``precision.apply_autocast`` (what its forward computes). Norms, embeddings and the residual stream stay as
the model has them; the LM head computes what the model's head computes (``Head``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..policies.cascade import MODEL_TYPES, supports


def why_not(model: torch.nn.Module) -> str | None:
    """Why the decoder cannot run ``model`` (None: it can): adapters (LoRA's layers add their own terms to the
    linear layers the decoder reads), or an architecture cascade attention is not exact for
    (``policies/cascade.py: supports``: Llama, Qwen2, Qwen3 with full attention)."""
    if hasattr(model, "get_base_model") or any(hasattr(m, "lora_A") for m in model.modules()):
        return "a model with adapters (LoRA)"
    config = getattr(model, "config", None)
    if config is None or not supports(config):
        return f"model type {getattr(config, 'model_type', None)!r} (cascade attention: {', '.join(MODEL_TYPES)}, " \
               "full attention)"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "an unexpected module layout"
    return None


EXACT_TOP = 64  # logits per row the copy's head recomputes in float32 (``policies/rollout_copy.py``)
EXACT_CHUNK_ROWS = 256  # rows per gather of the exact logits: bounds its (rows, EXACT_TOP, hidden) temporary


def exact_top(head: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (float32, from the head's bfloat16 weight, without its bias) with the bias added and each row's
    ``EXACT_TOP`` highest recomputed in float32 from ``x`` and the float32 weight, in place."""
    if head.bias is not None:
        logits = logits + head.bias.float()
    flat, xs = logits.view(-1, logits.shape[-1]), x.reshape(-1, x.shape[-1])
    for s in range(0, flat.shape[0], EXACT_CHUNK_ROWS):
        rows = flat[s:s + EXACT_CHUNK_ROWS]
        idx = rows.topk(min(EXACT_TOP, rows.shape[-1]), dim=-1).indices  # (n, k)
        exact = (head.weight[idx] @ xs[s:s + EXACT_CHUNK_ROWS, :, None]).squeeze(-1)  # (n, k, H) @ (n, H, 1)
        if head.bias is not None:
            exact = exact + head.bias.float()[idx]
        rows.scatter_(-1, idx, exact)
    return logits


PACK = True  # prepack CPU weights for oneDNN (off: plain F.linear, for comparison)
PACK_ROWS = 64  # the row count oneDNN is told to expect (the layout barely depends on it: docs/performance.md)


class Linear:
    """``x @ weight.T + bias`` with ``weight`` (out, in) prepacked for oneDNN where it can be (CPU, float32 or
    bfloat16), else ``F.linear``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.dtype, self.out_features = weight.dtype, weight.shape[0]
        self.bias = bias
        self.packed = _packed(weight)
        self.weight = None if self.packed is not None else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    if not (PACK and weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available()):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)
    except (RuntimeError, AttributeError):  # a build without oneDNN's linear ops: plain matmuls
        return None


class Head:
    """The LM head as the model computes it, on prepacked weights: a plain linear head in its weights' dtype
    (with autocast off, as ``precision.apply_autocast`` runs it); a rollout copy's head
    (``policies/rollout_copy.py``) ranks in bfloat16 and recomputes each row's highest logits in float32. Any
    other head is called as the module. The module's forward hooks run on the result, as they would."""

    def __init__(self, head: torch.nn.Module):
        self.module = head
        self.exact_top = hasattr(head, "atgrpo_weight_lp")
        plain = type(head) is torch.nn.Linear and "forward" not in head.__dict__
        autocast_head = hasattr(head, "atgrpo_device_type")  # precision.apply_autocast's head: autocast off
        if self.exact_top:
            self.linear = Linear(head.atgrpo_weight_lp.detach(), None)
        elif plain or autocast_head:
            self.linear = Linear(head.weight.detach(), None if head.bias is None else head.bias.detach())
        else:
            self.linear = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        head = self.module
        if self.linear is None or head._forward_pre_hooks:
            return head(x).float()
        if self.exact_top:
            out = exact_top(head, x.float(), self.linear(x.float().to(self.linear.dtype)).float())
        else:
            out = self.linear(x.to(self.linear.dtype))
        for hook in head._forward_hooks.values():
            r = hook(head, (x,), out)
            out = out if r is None else r
        return out.float()


@dataclass
class LayerWeights:
    qkv: Linear  # (H*D + 2*Hkv*D) outputs
    o: Linear
    gate_up: Linear  # 2 * intermediate outputs: gate, then up
    down: Linear
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    q_norm: torch.nn.Module | None  # Qwen3: an RMSNorm per head on queries and keys, before the rotation
    k_norm: torch.nn.Module | None


def _linear_dtype(model: torch.nn.Module) -> torch.dtype:
    auto = getattr(model, "atgrpo_autocast", None)  # precision.apply_autocast: (device type, dtype)
    if auto is not None:
        return auto[1]
    return model.model.layers[0].self_attn.o_proj.weight.dtype


def _sources(model: torch.nn.Module) -> list[torch.Tensor]:
    head = model.get_output_embeddings()
    extra = [head.atgrpo_weight_lp] if hasattr(head, "atgrpo_weight_lp") else []  # re-cast at a copy's refresh
    return [p for layer in model.model.layers for p in (*layer.self_attn.parameters(), *layer.mlp.parameters())
            ] + list(head.parameters()) + extra


def _cat(tensors, dtype) -> torch.Tensor:
    """The tensors concatenated, in ``dtype``; one tensor as it is where its dtype already is (no copy)."""
    if len(tensors) == 1:
        return tensors[0].detach().to(dtype)
    return torch.cat([t.detach() for t in tensors]).to(dtype)


def _bias(mods, dtype) -> torch.Tensor | None:
    if all(m.bias is None for m in mods):
        return None
    return _cat([m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in mods], dtype)


class DecoderWeights:
    """The fused, cast, packed weights of ``model``'s layers and its head, rebuilt when a source weight changes
    (``current``). A deep copy or a pickle carries the model only: oneDNN's packed tensors have no storage to
    copy, and the copy packs its own at its first step."""

    def __getstate__(self):
        return {"model": self.model, "layers": [], "head": None, "_stamp": []}

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers: list[LayerWeights] = []
        self.head: Head | None = None
        self._stamp: list[tuple[int, int]] = []

    def current(self) -> list[LayerWeights]:
        stamp = [(id(p), p._version) for p in _sources(self.model)]
        if stamp != self._stamp:
            self.layers, self._stamp = [], []  # free the old copies before making the new ones
            self.layers = self._build()
            self.head = Head(self.model.get_output_embeddings())
            self._stamp = stamp
        return self.layers

    def release(self) -> None:
        """Drop the fused, packed copies; the next ``current`` makes them again. Called before an update, whose
        optimizer steps change the source weights anyway: the update gets their memory."""
        self.layers, self.head, self._stamp = [], None, []

    @torch.no_grad()
    def _build(self) -> list[LayerWeights]:
        dtype = _linear_dtype(self.model)
        out = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv, gu = (a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)
            out.append(LayerWeights(
                qkv=Linear(_cat([x.weight for x in qkv], dtype), _bias(qkv, dtype)),
                o=Linear(_cat([a.o_proj.weight], dtype), _bias([a.o_proj], dtype)),
                gate_up=Linear(_cat([x.weight for x in gu], dtype), _bias(gu, dtype)),
                down=Linear(_cat([m.down_proj.weight], dtype), _bias([m.down_proj], dtype)),
                input_norm=layer.input_layernorm, post_norm=layer.post_attention_layernorm,
                q_norm=getattr(a, "q_norm", None), k_norm=getattr(a, "k_norm", None)))
        return out
