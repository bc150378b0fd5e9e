"""Cascade attention for decoding K branches of one prompt: the prompt's keys/values are read once per prompt.

After the K-way expansion, a plain KV cache holds K copies of each prompt's keys/values, and every decode step
reads all of them: with long prompts and short responses that is most of the attention's memory traffic. Here
the cache keeps each prompt's keys/values once (``B`` rows) and each branch's own generated keys/values apart
(``R = B * K`` rows, dropped when a branch finishes). A decode step's attention is computed in two parts and
merged exactly by log-sum-exp:

- prompt part: the live branches of prompt ``b`` are stacked as ``K_b`` queries against prompt ``b``'s keys,
  one batched matmul ``(B, H, K_max, D) @ (B, H, D, P)`` with the prompt's padding masked;
- own part: each branch's query against its own generated keys ``(R, H, 1, D) @ (R, H, D, t)``.

``softmax([s_p, s_r]) @ [V_p; V_r]`` equals ``(e^{m_p} O_p + e^{m_r} O_r) / (e^{m_p} l_p + e^{m_r} l_r)`` with
each part's max ``m``, sum ``l`` and unnormalised output ``O``, so results equal plain attention up to float
rounding (``tests/test_policy.py`` compares sampled tokens and log-probs with ``DynamicCache`` generation).

It plugs into transformers as an attention implementation (``ATTN_NAME``) that the policy switches on for the
decode steps only; the prefill and every training forward use the model's own attention.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import sdpa_mask

ATTN_NAME = "atgrpo_cascade"
MODEL_TYPES = ("llama", "qwen2", "qwen3")  # full causal attention, rotary positions, optional GQA: tested here


def supports(config) -> bool:
    """Cascade decoding is exact for full-attention decoders: no sliding windows (nor soft-capping or sinks,
    which these model types do not have)."""
    if getattr(config, "model_type", None) not in MODEL_TYPES or getattr(config, "use_sliding_window", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    return not layer_types or all(t == "full_attention" for t in layer_types)


class CascadeLayer(CacheLayerMixin):
    """One layer: the prompts' keys/values once (``B`` rows), the branches' own in a reserved buffer."""

    is_sliding = False

    def __init__(self, cache: "CascadeCache"):
        super().__init__()
        self.cache = cache
        self.prompt_k = self.prompt_v = None  # (B, Hkv, P, D)
        self.own_k = self.own_v = None  # (R, Hkv, max_new_tokens, D)
        self.generated = 0  # tokens written per branch (the same for every live branch)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.prompt_k is None:  # prefill: the prompts, attended by the model's own attention
            self.prompt_k, self.prompt_v = key_states, value_states
            return key_states, value_states
        t = self.generated
        if self.own_k is None:
            R, H, _, D = key_states.shape
            shape = (R, H, self.cache.max_new_tokens, D)
            self.own_k, self.own_v = key_states.new_empty(shape), value_states.new_empty(shape)
        self.own_k[:, :, t:t + 1] = key_states
        self.own_v[:, :, t:t + 1] = value_states
        self.generated = t + 1
        return self.own_k[:, :, :t + 1], self.own_v[:, :, :t + 1]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.own_k is not None:
            self.own_k, self.own_v = self.own_k[indices], self.own_v[indices]

    def get_seq_length(self) -> int:
        return (0 if self.prompt_k is None else self.prompt_k.shape[-2]) + self.generated

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class CascadeCache(Cache):
    """The cache of one ``generate`` call, with the batch operations of any cache: ``batch_repeat_interleave(n)``
    after the prefill makes ``n`` branches per prompt (no copy: it only records ``row_prompt[r]``, the prompt of
    live branch ``r``), ``batch_select_indices`` drops finished branches. ``prompt_mask`` (B, P): the prompts'
    real (non-padding) positions."""

    def __init__(self, prompt_mask: torch.Tensor, max_new_tokens: int):
        super().__init__(layer_class_to_replicate=lambda: CascadeLayer(self))
        self.prompt_mask = prompt_mask.bool()
        self.max_new_tokens = max_new_tokens
        self._set_rows(torch.arange(prompt_mask.shape[0], device=prompt_mask.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._set_rows(self.row_prompt.repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self._set_rows(self.row_prompt[indices])

    def _set_rows(self, row_prompt: torch.Tensor) -> None:
        """The live rows' prompts, and each row's slot within its prompt's group (rows stay sorted by prompt)."""
        counts = torch.bincount(row_prompt, minlength=self.prompt_mask.shape[0])
        starts = torch.cumsum(counts, 0) - counts
        self.row_prompt = row_prompt
        self.slot = torch.arange(len(row_prompt), device=row_prompt.device) - starts[row_prompt]
        self.k_max = int(counts.max()) if len(row_prompt) else 0


_ACTIVE: list[CascadeCache] = []  # the cache of the decode steps running now (set by ``decoding``)


@contextlib.contextmanager
def decoding(model, cache: CascadeCache) -> Iterator[None]:
    """Run the enclosed decode forwards with cascade attention, then restore the model's own attention."""
    configs = [m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
    saved = [c._attn_implementation for c in configs]
    _ACTIVE.append(cache)
    try:
        for c in configs:
            c._attn_implementation = ATTN_NAME
        yield
    finally:
        _ACTIVE.pop()
        for c, s in zip(configs, saved):
            c._attn_implementation = s


def _scores(q: torch.Tensor, k: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``q @ k^T`` per head: q (N, H, M, D), k (N, H / n_rep, S, D) -> (N, H, M, S). Grouped-query attention
    without repeating k: the n_rep query heads of a key head are stacked as rows against it."""
    N, H, M, D = q.shape
    return (q.reshape(N, H // n_rep, n_rep * M, D) @ k.transpose(-1, -2)).reshape(N, H, M, -1)


def _weighted(e: torch.Tensor, v: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``e @ v`` per head: e (N, H, M, S), v (N, H / n_rep, S, D) -> (N, H, M, D), v not repeated."""
    N, H, M, S = e.shape
    return (e.reshape(N, H // n_rep, n_rep * M, S) @ v).reshape(N, H, M, -1)


def cascade_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of one decode step (query length 1) over prompt (shared) + own (per branch) keys."""
    cache = _ACTIVE[-1]
    layer = cache.layers[module.layer_idx]
    n_rep = getattr(module, "num_key_value_groups", 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    R, H, _, D = query.shape
    B = layer.prompt_k.shape[0]
    # prompt part, grouped: (B, H, K_max, D) queries against each prompt's keys, read once
    qg = query.new_zeros((B, H, cache.k_max, D))
    qg[cache.row_prompt, :, cache.slot] = query[:, :, 0]
    s_p = _scores(qg, layer.prompt_k, n_rep) * scale  # (B, H, K_max, P)
    s_p = s_p.masked_fill(~cache.prompt_mask[:, None, None, :], float("-inf"))
    m_p = s_p.amax(-1, keepdim=True)
    e_p = torch.exp(s_p - m_p)
    o_p = _weighted(e_p, layer.prompt_v, n_rep)  # (B, H, K_max, D)
    l_p = e_p.sum(-1, keepdim=True)
    m_p, l_p, o_p = (x[cache.row_prompt, :, cache.slot][:, :, None] for x in (m_p, l_p, o_p))  # (R, H, 1, .)
    # own part: each branch against its generated keys (all live branches have the same count)
    s_r = _scores(query, key, n_rep) * scale  # (R, H, 1, t)
    m_r = s_r.amax(-1, keepdim=True)
    e_r = torch.exp(s_r - m_r)
    o_r = _weighted(e_r, value, n_rep)
    l_r = e_r.sum(-1, keepdim=True)
    m = torch.maximum(m_p, m_r)
    w_p, w_r = torch.exp(m_p - m), torch.exp(m_r - m)
    out = (o_p * w_p + o_r * w_r) / (l_p * w_p + l_r * w_r)  # (R, H, 1, D)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_NAME, cascade_attention)
AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # the mask is built as for sdpa, and not used
