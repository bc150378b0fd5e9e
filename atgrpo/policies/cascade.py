"""Cascade attention: K branches of one prompt read the prompt's keys/values once, in decoding and in training.

After a K-way expansion, a plain KV cache holds K copies of each prompt's keys/values, and every decode step
reads all of them (and the update's response pass back-propagates into all of them): with long prompts and short
responses that is most of the attention's memory traffic. Here the cache keeps each prompt's keys/values once
(``G`` rows) and each branch's own keys/values apart (``R`` rows: ``generate``'s reserved buffer, dropped when a
branch finishes, or the update's whole responses). Attention of a branch's ``M`` new positions (decode: 1; the
update: the whole response) is computed in two parts and merged exactly by log-sum-exp:

- prompt part: the branches of prompt ``g`` are stacked as ``K_g * M`` queries against prompt ``g``'s keys, one
  batched matmul ``(G, H, K_max * M, D) @ (G, H, D, P)`` with the prompt's padding masked;
- own part: each branch's queries against its own keys ``(R, H, M, D) @ (R, H, D, S)``, causal.

With ``m`` the joint row max and ``e = exp(s - m)``, ``softmax([s_p, s_r]) @ [V_p; V_r]`` equals
``(e_p @ V_p + e_r @ V_r) / (sum(e_p) + sum(e_r))``, so results (and, through autograd, the gradients) equal
plain attention up to float rounding (``tests/test_policy.py`` compares sampled tokens and
log-probs with ``DynamicCache`` generation, ``tests/test_shared_prefix.py`` gradients with one forward per sample).

It plugs into transformers as an attention implementation (``ATTN_NAME``) that ``active`` switches on for the
forwards after the prefill; the prefill (the prompts) and every other forward use the model's own attention.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache, CacheLayerMixin

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
        t, M = self.generated, key_states.shape[-2]
        self.generated = t + M
        if t == 0 and M == self.cache.max_new_tokens:  # the whole reservation at once (the update): no copy
            self.own_k, self.own_v = key_states, value_states
            return key_states, value_states
        if self.own_k is None:
            R, H, _, D = key_states.shape
            shape = (R, H, self.cache.max_new_tokens, D)
            self.own_k, self.own_v = key_states.new_empty(shape), value_states.new_empty(shape)
        self.own_k[:, :, t:t + M] = key_states
        self.own_v[:, :, t:t + M] = value_states
        return self.own_k[:, :, :t + M], self.own_v[:, :, :t + M]

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
    """The cache of one ``generate`` call or one shared-prefix scoring pass, with the batch operations of any
    cache: ``batch_repeat_interleave(n)`` after the prefill makes ``n`` branches per prompt (no copy: it only
    records ``row_prompt[r]``, the prompt of live branch ``r``), ``batch_select_indices`` drops finished
    branches, ``set_rows`` gives groups of any sizes. ``prompt_mask`` (B, P): the prompts' real (non-padding)
    positions; ``max_new_tokens``: the own positions reserved per branch."""

    def __init__(self, prompt_mask: torch.Tensor, max_new_tokens: int):
        super().__init__(layer_class_to_replicate=lambda: CascadeLayer(self))
        self.prompt_mask = prompt_mask.bool()
        # (B, 1, 1, P) additive: 0 on the prompts' tokens, -inf on their padding
        self.prompt_bias = torch.zeros(self.prompt_mask.shape, device=prompt_mask.device).masked_fill(
            ~self.prompt_mask, float("-inf"))[:, None, None, :]
        self.max_new_tokens = max_new_tokens
        self.set_rows(torch.arange(prompt_mask.shape[0], device=prompt_mask.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.set_rows(self.row_prompt.repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self.set_rows(self.row_prompt[indices])

    def set_rows(self, row_prompt: torch.Tensor) -> None:
        """The live rows' prompts (sorted: a prompt's branches are neighbours), each row's slot within its
        prompt's group, the largest group, and whether all groups have that size (then regrouping is a view)."""
        counts = torch.bincount(row_prompt, minlength=self.prompt_mask.shape[0])
        starts = torch.cumsum(counts, 0) - counts
        self.row_prompt = row_prompt
        self.slot = torch.arange(len(row_prompt), device=row_prompt.device) - starts[row_prompt]
        self.k_max = int(counts.max()) if len(row_prompt) else 0
        self.equal_groups = bool((counts == self.k_max).all())


_ACTIVE: list[CascadeCache] = []  # the cache of the forwards running now (set by ``active``)


@contextlib.contextmanager
def active(model, cache: CascadeCache) -> Iterator[None]:
    """Run the enclosed forwards (after the prefill) with cascade attention, then restore the model's own."""
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
    """Attention of ``M`` new positions per branch (decode: 1; the update's response pass: the whole response)
    over the branch's prompt (shared, one copy per prompt) and its own keys (causal among themselves).

    query (R, H, M, D); key, value (R, Hkv, S, D): the branch's own keys so far, the last M of them new.
    Scores, maxima and sums are float32 (as the eager attention's softmax); masks are additive biases (a
    broadcast ``masked_fill`` is several times slower on CPU). The maxima are constants for autograd (the
    result does not depend on them), so the backward is the plain attention's."""
    cache = _ACTIVE[-1]
    layer = cache.layers[module.layer_idx]
    n_rep = getattr(module, "num_key_value_groups", 1)
    M, S = query.shape[-2], key.shape[-2]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if _FLASH_CPU is not None and query.device.type == "cpu" and not torch.is_grad_enabled():
        return _flash_cpu(cache, layer, query, key, value, scale, n_rep), None
    q = query * scale
    # prompt part, grouped: the K_max * M queries of a prompt's branches against its keys, read once
    s_p = _scores(_to_groups(cache, q, M), layer.prompt_k, n_rep).float() + cache.prompt_bias  # (G, H, KM, P)
    # own part: each branch against its own keys, query i sees own keys up to S - M + i
    s_r = _scores(q, key, n_rep).float()  # (R, H, M, S)
    if M > 1:
        s_r = s_r + _causal_bias(M, S, s_r.device)
    with torch.no_grad():
        m = torch.maximum(_to_rows(cache, s_p.amax(-1, keepdim=True), M), s_r.amax(-1, keepdim=True))  # (R, H, M, 1)
    e_p = torch.exp(s_p - _to_groups(cache, m, M))
    e_r = torch.exp(s_r - m)
    o = (_to_rows(cache, _weighted(e_p.to(value.dtype), layer.prompt_v, n_rep), M)
         + _weighted(e_r.to(value.dtype), value, n_rep))  # (R, H, M, D)
    lse = _to_rows(cache, e_p.sum(-1, keepdim=True), M) + e_r.sum(-1, keepdim=True)
    out = (o / lse).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


# torch's fused CPU attention kernel, which also returns each row's log-sum-exp (no backward through it here)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _flash_cpu(cache: "CascadeCache", layer: CascadeLayer, query, key, value, scale: float, n_rep: int):
    """The same two-part attention without gradients (sampling, frozen scoring) on torch's fused CPU kernel:
    about half the time of the plain ops at decode shapes, where each op's fixed cost dominates. The two parts'
    outputs are merged by their log-sum-exps. Grouped-query heads are stacked as rows (no repeated keys)."""
    R, H, M, D = query.shape
    G, Hkv = layer.prompt_k.shape[0], layer.prompt_k.shape[1]
    qg = _to_groups(cache, query, M).reshape(G, Hkv, -1, D)  # (G, Hkv, n_rep * K_max * M, D)
    o_p, l_p = _FLASH_CPU(qg, layer.prompt_k, layer.prompt_v, 0.0, False, attn_mask=cache.prompt_bias.to(query.dtype),
                          scale=scale)
    own_bias = None
    if M > 1:  # causal with the queries' offset, tiled over the stacked heads
        own_bias = _causal_bias(M, key.shape[-2], query.device).to(query.dtype).repeat(n_rep, 1)
    o_r, l_r = _FLASH_CPU(query.reshape(R, Hkv, n_rep * M, D), key, value, 0.0, False, attn_mask=own_bias, scale=scale)
    part = torch.cat([o_p.float(), l_p[..., None]], -1).reshape(G, H, -1, D + 1)
    part = _to_rows(cache, part, M)  # (R, H, M, D + 1): the prompt part's output and log-sum-exp per branch
    o_p, l_p = part[..., :D], part[..., D:]
    o_r, l_r = o_r.reshape(R, H, M, D).float(), l_r.reshape(R, H, M, 1)
    lse = torch.logaddexp(l_p, l_r)
    out = o_p * torch.exp(l_p - lse) + o_r * torch.exp(l_r - lse)
    return out.to(query.dtype).transpose(1, 2).contiguous()


def _causal_bias(M: int, S: int, device) -> torch.Tensor:
    """(M, S): 0 where query i (the last M of S positions) may attend key j (j <= S - M + i), else -inf."""
    allowed = torch.arange(S, device=device) <= torch.arange(S - M, S, device=device)[:, None]
    return torch.zeros((M, S), device=device).masked_fill(~allowed, float("-inf"))


def _to_rows(cache: "CascadeCache", x: torch.Tensor, M: int) -> torch.Tensor:
    """Grouped ``(G, H, K_max * M, E)`` -> per branch ``(R, H, M, E)``."""
    G, H, _, E = x.shape
    x = x.view(G, H, cache.k_max, M, E)
    if cache.equal_groups:
        return x.transpose(1, 2).reshape(-1, H, M, E)
    return x[cache.row_prompt, :, cache.slot]


def _to_groups(cache: "CascadeCache", x: torch.Tensor, M: int) -> torch.Tensor:
    """Per branch ``(R, H, M, E)`` -> grouped ``(G, H, K_max * M, E)`` (absent slots 0)."""
    R, H, _, E = x.shape
    G = cache.prompt_mask.shape[0]
    if cache.equal_groups:
        return x.view(G, cache.k_max, H, M, E).transpose(1, 2).reshape(G, H, -1, E)
    out = x.new_zeros((G, H, cache.k_max, M, E))
    out[cache.row_prompt, :, cache.slot] = x
    return out.view(G, H, -1, E)


AttentionInterface.register(ATTN_NAME, cascade_attention)
AttentionMaskInterface.register(ATTN_NAME, lambda *args, **kwargs: None)  # masks come from the cache
