"""A KV cache with room reserved up front, so a decode step writes one token in place instead of copying.

transformers' ``DynamicCache`` appends each decode step's key/value with ``torch.cat``, which copies every row's
whole cache (prompt included) per layer per step. With K branches of long prompts and short responses that copy
was ~60% of rollout time on the tiny CPU policy (docs/performance.md). ``generate`` knows the prompt length and
``max_new_tokens`` before it starts, so it can reserve the whole length once: the prefill writes the prompt, the
K-way expansion copies it once into a buffer K times larger, and every decode step writes a single column.
Dropping finished rows is a row gather (one copy, only when some row finishes).

The cached tensors are the same values as ``DynamicCache``'s, so sampled tokens are identical
(``tests/test_policy.py``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


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
