"""KV caches for ``generate``: room reserved up front, so a decode step writes in place instead of copying.

transformers' ``DynamicCache`` appends each decode step's key/value with ``torch.cat``, which copies every row's
whole cache (prompt included) per layer per step. With K branches of long prompts and short responses that copy
was ~60% of rollout time on the tiny CPU policy (docs/performance.md). ``generate`` knows the prompt length and
``max_new_tokens`` before it starts, so it can reserve the whole length once: the prefill writes the prompt, the
K-way expansion copies it once into a buffer K times larger, and every decode step writes a single column.
Dropping finished rows is a row gather (one copy, only when some row finishes).

``CascadeCache`` goes further for ``n`` branches per prompt: each prompt's keys/values stay one copy, each
branch's own in a reserved buffer, attended by cascade attention (``cascade.py``).

The cached tensors are the same values as ``DynamicCache``'s, so sampled tokens are identical
(``tests/test_policy.py``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from .cascade import ATTN_NAME, Branches


class ReservedLayer(DynamicLayer):
    """One layer's keys/values as views ``[:, :, :length]`` of buffers with ``capacity`` positions."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.length, key_states.shape[-2]
        if self._kbuf is None or n + t > self._kbuf.shape[-2]:  # first write, or more tokens than reserved
            self._regrow(max(self.capacity, n + t), key_states, value_states)
        self._kbuf[:, :, n:n + t] = key_states
        self._vbuf[:, :, n:n + t] = value_states
        self.length = n + t
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row becomes ``repeats`` adjacent rows; only the filled positions are copied."""
        if self._kbuf is None:
            return
        self._kbuf, self._vbuf = (self._repeated(buf, repeats) for buf in (self._kbuf, self._vbuf))
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._kbuf is None:
            return
        self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
        self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        self._expose()

    def reset(self) -> None:
        self.length, self._kbuf, self._vbuf = 0, None, None
        super().reset()

    # ---- internals ----------------------------------------------------------------------------------------
    def _regrow(self, capacity: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        def grown(buf: torch.Tensor | None, new_states: torch.Tensor) -> torch.Tensor:
            B, H, _, D = new_states.shape
            new = new_states.new_empty((B, H, capacity, D))
            if buf is not None and self.length:
                new[:, :, :self.length] = buf[:, :, :self.length]
            return new

        self._kbuf, self._vbuf = grown(self._kbuf, key_states), grown(self._vbuf, value_states)

    def _repeated(self, buf: torch.Tensor, repeats: int) -> torch.Tensor:
        B, H, C, D = buf.shape
        new = buf.new_empty((B * repeats, H, C, D))
        new.view(B, repeats, H, C, D)[:, :, :, :self.length] = buf[:, None, :, :self.length]
        return new

    def _expose(self) -> None:
        if self._kbuf is not None:
            self.keys, self.values = self._kbuf[:, :, :self.length], self._vbuf[:, :, :self.length]


class ReservedCache(Cache):
    """A cache of ``ReservedLayer``s, each reserving ``capacity`` positions (prompt + new tokens)."""

    def __init__(self, capacity: int):
        super().__init__(layer_class_to_replicate=lambda: ReservedLayer(capacity))


class CascadeLayer(CacheLayerMixin):
    """One layer: the prompts' keys/values once (``G`` rows), the branches' own in a reserved buffer."""

    is_sliding = False

    def __init__(self, cache: "CascadeCache"):
        super().__init__()
        self.cache = cache
        self.prompt_k = self.prompt_v = None  # (G, Hkv, P, D)
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
    """The cache of one ``generate`` call for cascade decoding (``cascade.active(model, cache)`` around the
    decode steps), with the batch operations of any cache: ``batch_repeat_interleave(n)`` after the prefill
    makes ``n`` branches per prompt (no copy: it only records each live branch's prompt), and
    ``batch_select_indices`` drops finished branches. ``prompt_mask`` (G, P): the prompts' real (non-padding)
    positions."""

    attn_impl = ATTN_NAME

    def __init__(self, prompt_mask: torch.Tensor, max_new_tokens: int):
        super().__init__(layer_class_to_replicate=lambda: CascadeLayer(self))
        self.branches = Branches(prompt_mask, torch.arange(prompt_mask.shape[0], device=prompt_mask.device))
        self.max_new_tokens = max_new_tokens

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.branches.set_rows(self.branches.row_prompt.repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self.branches.set_rows(self.branches.row_prompt[indices])
