"""Cascade attention: the K branches of one prompt read the prompt's keys/values once, in sampling and training.

After a K-way expansion, a plain KV cache holds K copies of each prompt's keys/values; every decode step reads
all of them, and a loss over K expanded copies back-propagates into all of them. With long prompts and short
responses that is most of the attention's work. Here each prompt's keys/values stay one copy (``G`` rows) and
each branch's own keys/values are apart (``R`` rows). Attention of a branch's ``M`` positions (decode: 1; the
update: the whole response) is computed in two parts and merged exactly:

- prompt part: the branches of prompt ``g`` are stacked as ``K_g * M`` queries (and grouped-query heads as
  rows) against prompt ``g``'s keys, ``(G, Hkv, n_rep * K_max * M, D)`` against ``(G, Hkv, P, D)``, the
  prompt's padding masked;
- own part: each branch's queries against its own keys ``(R, Hkv, n_rep * M, D)`` against ``(R, Hkv, S, D)``,
  causal.

Each part is one fused attention call that returns its output and the log-sum-exp of its scores
(``attention_part.attend``); ``lse = logaddexp(l_p, l_r)`` and ``o = o_p exp(l_p - lse) + o_r exp(l_r - lse)``
are the joint softmax's exactly. With gradients (the update, the warm start) nothing of the scores' size is kept:
the backward recomputes each part's scores from the merged output and log-sum-exp (``attention_part``), so the
memory of the update grows with the tokens, not with tokens x prompt length. Results and gradients equal plain
attention up to float rounding (``tests/test_attention_part.py`` against one softmax over the joined keys,
``tests/test_policy.py`` sampled tokens and log-probs against ``DynamicCache`` generation,
``tests/test_shared_prefix.py`` gradients against one forward per sample).

Two transformers attention implementations use it, switched on by ``active`` and off after:

- ``ATTN_NAME`` (sampling): decode steps over a ``kv_cache.CascadeCache`` (the prefill, the prompts alone, runs
  the model's own attention);
- ``TREE_NAME`` (the update, ``shared_prefix.py``): one forward over a packed prefix tree, the ``G`` prompts'
  tokens then the ``R`` responses' tokens in one sequence; the prompts attend themselves causally, the responses
  attend their prompt and themselves. One pass runs every linear layer once over all tokens.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface

from .attention_part import attend, attend_backward, merge

ATTN_NAME = "atgrpo_cascade"
TREE_NAME = "atgrpo_prefix_tree"
MODEL_TYPES = ("llama", "qwen2", "qwen3")  # full causal attention, rotary positions, optional GQA: tested here


def supports(config) -> bool:
    """Cascade attention is exact for full-attention decoders: no sliding windows (nor soft-capping or sinks,
    which these model types do not have)."""
    if getattr(config, "model_type", None) not in MODEL_TYPES or getattr(config, "use_sliding_window", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    return not layer_types or all(t == "full_attention" for t in layer_types)


class Branches:
    """Which prompt each branch belongs to. ``prompt_mask`` (G, P): the prompts' real (non-padding) positions;
    ``set_rows(row_prompt)``: the prompt of each branch row, sorted (a prompt's branches are neighbours)."""

    def __init__(self, prompt_mask: torch.Tensor, row_prompt: torch.Tensor):
        self.G = prompt_mask.shape[0]
        # (G, 1, 1, P) additive: 0 on the prompts' tokens, -inf on their padding
        self.prompt_bias = torch.zeros(prompt_mask.shape, device=prompt_mask.device).masked_fill(
            ~prompt_mask.bool(), float("-inf"))[:, None, None, :]
        self.set_rows(row_prompt)

    def set_rows(self, row_prompt: torch.Tensor) -> None:
        """Each row's slot within its prompt's group, the largest group, and whether all groups have that size
        (then regrouping is a view and one copy, else an index)."""
        counts = torch.bincount(row_prompt, minlength=self.G)
        starts = torch.cumsum(counts, 0) - counts
        self.row_prompt = row_prompt
        self.slot = torch.arange(len(row_prompt), device=row_prompt.device) - starts[row_prompt]
        self.k_max = int(counts.max()) if len(row_prompt) else 0
        self.equal_groups = bool((counts == self.k_max).all())

    def to_rows(self, x: torch.Tensor, M: int) -> torch.Tensor:
        """Grouped ``(G, H, K_max * M, E)`` -> per branch ``(R, H, M, E)``."""
        G, H, _, E = x.shape
        x = x.view(G, H, self.k_max, M, E)
        if self.equal_groups:
            return x.transpose(1, 2).reshape(-1, H, M, E)
        return x[self.row_prompt, :, self.slot]

    def to_groups(self, x: torch.Tensor, M: int) -> torch.Tensor:
        """Per branch ``(R, H, M, E)`` -> grouped ``(G, H, K_max * M, E)`` (absent slots 0)."""
        R, H, _, E = x.shape
        if self.equal_groups:
            return x.view(self.G, self.k_max, H, M, E).transpose(1, 2).reshape(self.G, H, -1, E)
        out = x.new_zeros((self.G, H, self.k_max, M, E))
        out[self.row_prompt, :, self.slot] = x
        return out.view(self.G, H, -1, E)


def two_part_attention(br: Branches, query, prompt_k, prompt_v, own_k, own_v, scale: float,
                       n_rep: int) -> torch.Tensor:
    """Attention of ``M`` positions per branch over its prompt (one copy per prompt) and its own keys, the
    queries being the last ``M`` of the ``S`` own positions (causal among them).

    query (R, H, M, D); prompt_k, prompt_v (G, Hkv, P, D); own_k, own_v (R, Hkv, S, D); returns (R, H, M, D).
    Each part is one fused attention call (``attention_part.attend``: the prompt part with the branches of a
    prompt stacked as its query rows, grouped-query heads stacked as rows, no repeated keys), merged by the parts'
    log-sum-exps. With gradients (``_TwoPart``) only the merged output and log-sum-exp are kept: the backward
    recomputes each part's scores from them, so no ``(queries x keys)`` scores stay alive between the forward and
    the backward."""
    dev = query.device.type
    if torch.is_autocast_enabled(dev):  # model.autocast: attention in its dtype, as torch's own attention under it
        dt = torch.get_autocast_dtype(dev)
        query, prompt_k, prompt_v, own_k, own_v = (x.to(dt) for x in (query, prompt_k, prompt_v, own_k, own_v))
    R, H, M, D = query.shape
    Hkv, S = prompt_k.shape[1], own_k.shape[-2]
    q_prompt = br.to_groups(query, M).reshape(br.G, Hkv, -1, D)  # (G, Hkv, n_rep * K_max * M, D)
    q_own = query.reshape(R, Hkv, n_rep * M, D)
    own_bias = None
    if M > 1:  # causal with the queries' offset, tiled over the stacked heads
        own_bias = _causal_bias(M, S, query.device).repeat(n_rep, 1)
    return _TwoPart.apply(q_prompt, q_own, prompt_k, prompt_v, own_k, own_v, br, own_bias, scale, M)


class _TwoPart(torch.autograd.Function):
    """``two_part_attention`` on its two stacked query layouts; keeps the inputs, the merged output and the
    merged log-sum-exp, nothing of the scores' size (``attention_part``)."""

    @staticmethod
    def forward(ctx, q_prompt, q_own, prompt_k, prompt_v, own_k, own_v, br: Branches, own_bias, scale: float,
                M: int):
        R, Hkv, nM, D = q_own.shape
        H = Hkv * (nM // M)
        with torch.autocast(q_own.device.type, enabled=False):
            o_p, l_p = attend(q_prompt, prompt_k, prompt_v, br.prompt_bias, scale)
            o_r, l_r = attend(q_own, own_k, own_v, own_bias, scale)
            # the prompt part per branch: (R, H, M, D + 1), output and log-sum-exp side by side
            part = br.to_rows(torch.cat([o_p.float(), l_p[..., None]], -1).reshape(br.G, H, -1, D + 1), M)
            o, lse = merge(part[..., :D], part[..., D], o_r.reshape(R, H, M, D), l_r.reshape(R, H, M))
            o = o.to(q_own.dtype)
        ctx.save_for_backward(q_prompt, q_own, prompt_k, prompt_v, own_k, own_v, o, lse)
        ctx.br, ctx.own_bias, ctx.scale, ctx.M = br, own_bias, scale, M
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q_prompt, q_own, prompt_k, prompt_v, own_k, own_v, o, lse = ctx.saved_tensors
        br, M, scale = ctx.br, ctx.M, ctx.scale
        R, H, _, D = o.shape
        Hkv = q_own.shape[1]
        with torch.autocast(q_own.device.type, enabled=False):
            # the gradient, output and log-sum-exp in the prompt part's layout (absent slots 0: they get none)
            g = br.to_groups(torch.cat([grad_o.float(), o.float(), lse[..., None]], -1), M).reshape(
                br.G, Hkv, -1, 2 * D + 1)
            dq_p, dk_p, dv_p = attend_backward(g[..., :D], q_prompt, prompt_k, prompt_v, g[..., D:2 * D],
                                               g[..., 2 * D], br.prompt_bias, scale)
            dq_o, dk_o, dv_o = attend_backward(grad_o.reshape(q_own.shape), q_own, own_k, own_v,
                                               o.reshape(q_own.shape), lse.reshape(q_own.shape[:-1]), ctx.own_bias,
                                               scale)
        return dq_p, dq_o, dk_p, dv_p, dk_o, dv_o, None, None, None, None


def _causal_bias(M: int, S: int, device) -> torch.Tensor:
    """(M, S): 0 where query i (the last M of S positions) may attend key j (j <= S - M + i), else -inf."""
    allowed = torch.arange(S, device=device) <= torch.arange(S - M, S, device=device)[:, None]
    return torch.zeros((M, S), device=device).masked_fill(~allowed, float("-inf"))


class PrefixTree:
    """The layout of one packed forward (batch 1): ``G`` prompts of ``P`` tokens (right-padded, ``prompt_mask``)
    then ``R`` branches of ``M`` tokens, branch ``r`` continuing prompt ``row_prompt[r]``."""

    attn_impl = TREE_NAME

    def __init__(self, prompt_mask: torch.Tensor, row_prompt: torch.Tensor, M: int):
        self.branches = Branches(prompt_mask, row_prompt)
        self.G, self.P = prompt_mask.shape
        self.R, self.M = len(row_prompt), M

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-major ``(H, N, D)`` -> the prompts ``(G, H, P, D)`` and the branches ``(R, H, M, D)`` (views;
        ``torch.split``, whose backward joins the two gradients, where slicing would zero-fill a whole copy)."""
        p, b = x.split([self.G * self.P, self.R * self.M], dim=1)
        return p.unflatten(1, (self.G, self.P)).transpose(0, 1), b.unflatten(1, (self.R, self.M)).transpose(0, 1)


def tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of a packed prefix-tree forward (``PrefixTree``): query (1, H, N, D), key/value (1, Hkv, N, D).
    The prompts attend themselves causally (right padding: a real position never sees padding; padding
    positions' outputs are finite and unused), the branches their prompt's real tokens and themselves."""
    if dropout:
        raise NotImplementedError("prefix-tree attention has no attention dropout (set attention_dropout=0)")
    tree: PrefixTree = _ACTIVE[-1]
    n_rep = getattr(module, "num_key_value_groups", 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # squeeze, not x[0]: the backward of an index zero-fills a whole copy
    (qp, qb), (kp, kb), (vp, vb) = (tree.split(x.squeeze(0)) for x in (query, key, value))
    out_p = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=n_rep > 1)
    parts = [out_p.transpose(1, 2).flatten(0, 1)]  # (G * P, H, D)
    if tree.M:
        out_b = two_part_attention(tree.branches, qb, kp, vp, kb, vb, scale, n_rep)  # (R, H, M, D)
        parts.append(out_b.transpose(1, 2).flatten(0, 1))
    return torch.cat(parts)[None], None  # (1, N, H, D)


def cascade_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of decode steps over a ``kv_cache.CascadeCache``: query (R, H, 1, D), key/value the branches'
    own keys so far (R, Hkv, S, D)."""
    cache = _ACTIVE[-1]
    layer = cache.layers[module.layer_idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = two_part_attention(cache.branches, query, layer.prompt_k, layer.prompt_v, key, value, scale,
                             getattr(module, "num_key_value_groups", 1))
    return out.transpose(1, 2).contiguous(), None


_ACTIVE: list = []  # the CascadeCache or PrefixTree of the forwards running now (set by ``active``)


@contextlib.contextmanager
def active(model, state) -> Iterator[None]:
    """Run the enclosed forwards with ``state.attn_impl`` (a ``CascadeCache``: decode steps; a ``PrefixTree``:
    a packed forward), then restore the model's own attention."""
    configs = [m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
    saved = [c._attn_implementation for c in configs]
    _ACTIVE.append(state)
    try:
        for c in configs:
            c._attn_implementation = state.attn_impl
        yield
    finally:
        _ACTIVE.pop()
        for c, s in zip(configs, saved):
            c._attn_implementation = s


def checkpoint_context(model):
    """``context_fn`` for ``torch.utils.checkpoint`` (non-reentrant) on ``model``'s layers: gradient checkpointing
    recomputes a layer's forward during the backward pass, after ``active`` has restored the model's own
    attention, so a prefix-tree forward would be recomputed with plain causal attention over the packed sequence
    (wrong gradients). Each checkpointed call captures the tree or cache active when it ran and reinstates it
    around its recompute, so the recomputed forward is the one that ran."""
    def context_fn():
        state = _ACTIVE[-1] if _ACTIVE else None
        return contextlib.nullcontext(), (active(model, state) if state is not None else contextlib.nullcontext())

    return context_fn


def enable_checkpointing(model) -> None:
    """Gradient (activation) checkpointing of a transformers model's layers, non-reentrant, with the attention
    in use made part of each recomputed forward (``checkpoint_context``)."""
    kwargs = {"use_reentrant": False, "context_fn": checkpoint_context(model)}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x; older: gradient_
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


for _name, _fn in ((ATTN_NAME, cascade_attention), (TREE_NAME, tree_attention)):
    AttentionInterface.register(_name, _fn)
    AttentionMaskInterface.register(_name, lambda *args, **kwargs: None)  # masks come from the cache or tree
