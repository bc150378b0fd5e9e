"""The native engine's decoding step: the model's layers run by hand over a preallocated, two-part KV cache.

``native_generate`` (``native.py``) runs the distinct prompts once (``Decoder.prefill``: packed into one sequence),
then decodes their ``n`` branches with ``Decoder.step``; both compute what the transformers forward computes for
Llama, Qwen2 and Qwen3 (the same norms and rotary modules, the same math) in far fewer operations:

- one matmul for the query, key and value projections and one for the MLP's gate and up projections
  (``weights.py``), the rotation of queries and keys together in four elementwise operations;
- attention in two parts merged by their log-sum-exps (cascade attention): each prompt's keys and values one copy
  that all its branches read, attended with torch's fused CPU kernel (plain matmuls on other devices) with the
  branches of a prompt stacked as rows; each branch's own keys from one preallocated buffer
  ``(layers, 2, rows, kv heads, max_new_tokens, head dim)``, written in place at each step;
- no cache object, mask construction or module dispatch per layer;
- on the CPU, where they build (``kernels.py``), the project's own kernels: a step's attention (both parts and
  the merge), the prefill's causal attention and each residual add + norm are one call each.

Static shapes: with ``static=True`` a step attends over the whole own-key buffer with a bias that hides the
positions not yet written (the step number is a tensor), so every step of a batch has the same shapes and no
host synchronisation (``tests/test_engine.py`` records a step's operations and fails on any that would
synchronise): what CUDA graph capture needs (``graphs.py``). Eager steps on the CPU slice the buffer to the
positions written instead, which reads less.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..policies.attention_part import attend
from ..policies.cascade import Branches
from . import kernels
from .weights import DecoderWeights


PROFILE = False  # benchmarks/decode_profile.py: mark each part of a step for torch.profiler
_NULL = contextlib.nullcontext()


def part(name: str):
    """A profiler range named ``decode/<name>`` when ``PROFILE`` is on, else nothing."""
    return torch.profiler.record_function(f"decode/{name}") if PROFILE else _NULL


class DecodeState:
    """One ``generate`` call's decoding state: the prompts' keys/values (one copy per prompt, per layer), the
    branches' own keys/values (``own``), which prompt each live row continues (``branches``), and the step."""

    def __init__(self, prompt_k: list[torch.Tensor], prompt_v: list[torch.Tensor], prompt_mask: torch.Tensor,
                 rows: int, max_new_tokens: int, dtype: torch.dtype, kernel: bool = False):
        G, Hkv, P, D = prompt_k[0].shape
        self.prompt_k, self.prompt_v = prompt_k, prompt_v
        self.branches = Branches(prompt_mask, torch.arange(G, device=prompt_mask.device))
        self.prompt_bias = self.branches.prompt_bias.to(dtype)  # (G, 1, 1, P): 0 on tokens, -inf on padding
        self.own = prompt_k[0].new_zeros((len(prompt_k), 2, rows, Hkv, max_new_tokens, D), dtype=dtype)
        self.t = 0  # positions written per branch
        # the CPU kernel (kernels.py) reads each prompt's keys transposed, its values perhaps paired, and its
        # length (its mask a prefix)
        self.prompt_kt, self.prompt_vk, self.prompt_len = None, None, None
        lens = prompt_mask.sum(1) if kernel else None
        if kernel and bool((prompt_mask == (torch.arange(P, device=lens.device) < lens[:, None])).all()):
            self.prompt_kt = [kernels.transpose_keys(k.contiguous()) for k in prompt_k]
            self.prompt_vk = [kernels.pair_values(v) for v in prompt_v]
            self.prompt_len = lens.long()

    def expand(self, n: int) -> None:
        """Each prompt's ``n`` branches as adjacent rows (after the prefill)."""
        self.branches.set_rows(self.branches.row_prompt.repeat_interleave(n))

    def keep(self, idx: torch.Tensor) -> None:
        """Keep the rows ``idx`` (in order): drop finished branches, copying only the positions written."""
        t = self.t
        own = self.own.new_zeros((*self.own.shape[:2], len(idx), *self.own.shape[3:]))
        own[..., :t, :] = self.own[:, :, idx, :, :t]
        self.own = own
        self.branches.set_rows(self.branches.row_prompt[idx])


class Decoder:
    """Decoding steps of one Llama-family model (``weights.why_not(model)`` is None)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        cfg = self.model.config
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.scale = self.D ** -0.5
        self.weights = DecoderWeights(self.model)
        inner = self.model.model
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, inner.norm
        auto = getattr(self.model, "atgrpo_autocast", None)
        self.attn_dtype = auto[1] if auto is not None else self.weights.current()[0].o.dtype

    @torch.no_grad()
    def prefill(self, prompt_ids: list[list[int]], device) -> tuple[torch.Tensor, list, list, torch.Tensor]:
        """Run the prompts once: ``(logits of each prompt's last position (G, V) float32, the prompts' keys and
        values per layer (G, Hkv, P, D), right-padded, and their mask (G, P))``. The prompts are packed into one
        sequence without padding: every matmul runs once over all their tokens, and each prompt's causal
        attention is one fused call (no padding mask, so the kernel skips the upper triangle)."""
        H, Hkv, D = self.H, self.Hkv, self.D
        lens = [len(p) for p in prompt_ids]
        if not lens or min(lens) == 0:
            raise ValueError("generate: every prompt needs at least one token")
        G, P, N = len(lens), max(lens), sum(lens)
        starts = [sum(lens[:i]) for i in range(G)]
        flat = torch.tensor([t for p in prompt_ids for t in p], dtype=torch.long, device=device)
        pos = torch.cat([torch.arange(n, device=device) for n in lens])
        mask = torch.zeros((G, P), dtype=torch.long, device=device)
        for i, n in enumerate(lens):
            mask[i, :n] = 1
        layers = self.weights.current()
        ldt, adt = layers[0].qkv.dtype, self.attn_dtype
        kernel = self.kernel_for(flat.device)
        lens_t, starts_t = torch.tensor(lens), torch.tensor(starts)
        with part("prefill"):
            h = self.embed(flat)  # (N, hidden)
            cos, sin = self._rotation(h, pos)
            keys, values = [], []
            for w in layers:
                with part("prefill/matmul"):
                    qkv = w.qkv(_rms_norm(w.input_norm, h).to(ldt)).view(N, H + 2 * Hkv, D)
                with part("prefill/rotary_cache"):
                    q, k = self._rotate(w, qkv, cos, sin).split([H, Hkv], dim=1)
                    v = qkv[:, H + Hkv:].to(adt)
                    pk, pv = k.new_zeros((G, Hkv, P, D)), v.new_zeros((G, Hkv, P, D))
                    for i, (s0, n) in enumerate(zip(starts, lens)):
                        pk[i, :, :n], pv[i, :, :n] = k[s0:s0 + n].transpose(0, 1), v[s0:s0 + n].transpose(0, 1)
                with part("prefill/attention"):
                    if kernel:  # the CPU kernel: all prompts' causal attention in one call
                        o = kernels.prefill_attention(q.contiguous(), kernels.transpose_keys(pk),
                                                      kernels.pair_values(pv), lens_t, starts_t, self.scale)
                    else:
                        o = q.new_empty((N, H, D))
                        for i, (s0, n) in enumerate(zip(starts, lens)):
                            o[s0:s0 + n] = F.scaled_dot_product_attention(
                                q[s0:s0 + n].transpose(0, 1)[None], pk[i:i + 1, :, :n], pv[i:i + 1, :, :n],
                                is_causal=True, scale=self.scale, enable_gqa=H != Hkv)[0].transpose(0, 1)
                keys.append(pk)
                values.append(pv)
                with part("prefill/matmul"):
                    h = h + w.o(o.view(N, H * D).to(ldt))
                    g, u = w.gate_up(_rms_norm(w.post_norm, h).to(ldt)).chunk(2, -1)
                    h = h + w.down(F.silu(g) * u)
            last = torch.tensor([s0 + n - 1 for s0, n in zip(starts, lens)], device=device)
            logits = self.weights.head(_rms_norm(self.norm, h[last]))
        return logits, keys, values, mask

    def _rotation(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin at positions ``pos  # (N,)``, (N, 1, D) float32, rotate_half's signs folded into
        sin (so that ``x cos + roll(x) sin`` is the model's ``x cos + rotate_half(x) sin``)."""
        cos, sin = self.rotary(h, pos[:, None])
        half = self.D // 2
        sin = sin.float()
        return cos.float(), torch.cat([-sin[..., :half], sin[..., half:]], -1)

    def _normed_qk(self, w, qkv: torch.Tensor) -> torch.Tensor:
        """Queries and keys of ``qkv  # (N, H + 2 Hkv, D)`` (after Qwen3's per-head norms): (N, H + Hkv, D)."""
        H, Hkv = self.H, self.Hkv
        if w.q_norm is not None:
            return torch.cat([w.q_norm(qkv[:, :H]), w.k_norm(qkv[:, H:H + Hkv])], 1)
        return qkv[:, :H + Hkv]

    def _rotate(self, w, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Queries and keys of ``qkv  # (N, H + 2 Hkv, D)``, normed and rotated, in the attention dtype:
        (N, H + Hkv, D)."""
        qk = self._normed_qk(w, qkv)
        # float32 cos/sin promote a bfloat16 qk exactly, as in the model's forward under autocast
        return (qk * cos + qk.roll(self.D // 2, -1) * sin).to(self.attn_dtype)

    def new_state(self, prompt_k, prompt_v, prompt_mask, rows: int, max_new_tokens: int) -> DecodeState:
        """A decoding state for prompts' keys/values (from ``prefill`` or the model's own forward); the weights
        brought up to date here serve all the state's steps."""
        self.weights.current()
        dt = self.attn_dtype
        return DecodeState([k.to(dt) for k in prompt_k], [v.to(dt) for v in prompt_v], prompt_mask, rows,
                           max_new_tokens, dt, self.kernel_for(prompt_k[0].device))

    def kernel_for(self, device: torch.device) -> bool:
        """Whether the CPU kernels (``kernels.py``) run this model's attention on ``device``."""
        return device.type == "cpu" and self.attn_dtype in (torch.float32, torch.bfloat16) and \
            kernels.module() is not None

    @torch.no_grad()
    def step(self, st: DecodeState, tok: torch.Tensor, pos: torch.Tensor, static: bool = False,
             t: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(A, V)`` (float32) of the next token of each live row, after feeding it ``tok  # (A,)`` at
        positions ``pos  # (A,)``; writes the rows' keys/values at own position ``st.t`` (``t``, a tensor, when
        ``static``) and advances ``st.t``. Runs the weights the prefill of this state made current (the weights
        cannot change within a ``generate`` call)."""
        H, Hkv, D = self.H, self.Hkv, self.D
        A = tok.shape[0]
        layers = self.weights.layers
        with part("embed_rotary"):
            h = self.embed(tok)  # (A, hidden)
            cos, sin = self._rotation(h, pos)  # (A, 1, D)
        ldt = layers[0].qkv.dtype
        if static:  # attend the whole own buffer; positions after t hidden
            written = torch.arange(st.own.shape[-2], device=tok.device) <= t
            own_bias = torch.zeros(written.shape, dtype=self.attn_dtype, device=tok.device).masked_fill(
                ~written, float("-inf"))[None, None, None, :]
            own_len = st.own.shape[-2]
        else:
            own_bias, own_len = None, st.t + 1
        fused = st.prompt_kt is not None and not static  # the CPU kernels (kernels.py) serve this eager step
        a = None  # the last MLP's output, added to the residual stream with the next norm
        for li, w in enumerate(layers):
            with part("norm"):
                h, x = _add_norm(w.input_norm, h, a, ldt, fused)
            with part("matmul"):
                qkv = w.qkv(x).view(A, H + 2 * Hkv, D)
            own_k, own_v = st.own[li, 0], st.own[li, 1]  # (R, Hkv, T, D)
            if fused:  # rotation and cache write in one call of the CPU kernels
                with part("rotary_cache"):
                    qk, v = self._normed_qk(w, qkv), qkv[:, H + Hkv:]
                    if qk.dtype != v.dtype:  # Qwen3's norms may return float32: both exactly in float32
                        qk, v = qk.float(), v.float()
                    q = kernels.rotate_write(qk, v, cos, sin, own_k, own_v, st.t)
            else:
                with part("rotary_cache"):
                    q, k = self._rotate(w, qkv, cos, sin).split([H, Hkv], dim=1)
                    v = qkv[:, H + Hkv:]
                    if static:
                        own_k.index_copy_(2, t.view(1), k[:, :, None])
                        own_v.index_copy_(2, t.view(1), v.to(self.attn_dtype)[:, :, None])
                    else:
                        own_k[:, :, st.t] = k
                        own_v[:, :, st.t] = v
            with part("attention"):
                if fused:  # both parts in one call of the CPU kernel
                    o = kernels.decode_attention(q.contiguous(), st.prompt_kt[li], st.prompt_vk[li], st.prompt_len,
                                                 own_k, own_v, own_len, st.branches.row_prompt, self.scale).to(ldt)
                else:
                    o = self._attention(st, q, own_k[:, :, :own_len], own_v[:, :, :own_len], li, own_bias).to(ldt)
            with part("matmul"):
                o = w.o(o)
            with part("norm"):
                h, x = _add_norm(w.post_norm, h, o, ldt, fused)
            with part("matmul"):
                gu = w.gate_up(x)
            with part("activation"):
                if fused:  # one call of the CPU kernels
                    a = kernels.silu_mul(gu)
                else:
                    g, u = gu.chunk(2, -1)
                    a = F.silu(g) * u
            with part("matmul"):
                a = w.down(a)
        if not static:
            st.t += 1
        with part("norm"):
            h = _add_norm(self.norm, h, a, h.dtype, fused)[1]
        with part("head"):
            return self.weights.head(h)

    def _attention(self, st: DecodeState, q: torch.Tensor, own_k, own_v, li: int, own_bias) -> torch.Tensor:
        """q (A, H, D) -> (A, H * D): softmax over the row's prompt and its own keys, the two parts merged by their
        log-sum-exps: ``o = o_own + sigmoid(lse_prompt - lse_own) * (o_prompt - o_own)``."""
        A, H, D = q.shape
        br, Hkv = st.branches, self.Hkv
        n_rep = H // Hkv
        o_r, l_r = attend(q.view(A, Hkv, n_rep, D), own_k, own_v, own_bias, self.scale)  # (A, Hkv, n_rep, .)
        if br.equal_groups:  # the K branches of a prompt stacked as rows: (G, Hkv, K * n_rep, D)
            G, K = br.G, br.k_max
            qg = q.view(G, K, Hkv, n_rep, D).transpose(1, 2).reshape(G, Hkv, K * n_rep, D)
            o_p, l_p = attend(qg, st.prompt_k[li], st.prompt_v[li], st.prompt_bias, self.scale)
            # both parts as (G, K, Hkv, n_rep, .) views, merged straight into the rows' layout
            o_p, l_p = o_p.view(G, Hkv, K, n_rep, D).transpose(1, 2), l_p.view(G, Hkv, K, n_rep).transpose(1, 2)
            o_r, l_r = o_r.view(G, K, Hkv, n_rep, D), l_r.view(G, K, Hkv, n_rep)
        else:  # after rows were dropped: absent slots padded
            qg = br.to_groups(q[:, :, None], 1).reshape(br.G, Hkv, -1, D)
            o_p, l_p = attend(qg, st.prompt_k[li], st.prompt_v[li], st.prompt_bias, self.scale)
            rows = br.to_rows(torch.cat([o_p.float(), l_p[..., None]], -1).reshape(br.G, H, -1, D + 1), 1)
            o_p, l_p = rows[..., 0, :D].view(A, Hkv, n_rep, D), rows[..., 0, D].view(A, Hkv, n_rep)
        w = torch.sigmoid(l_p - l_r)[..., None]  # the prompt part's share of the softmax mass
        out = q.new_empty((A, H * D), dtype=torch.float32)
        torch.lerp(o_r.float(), o_p.float(), w, out=out.view(o_r.shape))
        return out


def _add_norm(norm: torch.nn.Module, h: torch.Tensor, delta: torch.Tensor | None, dtype: torch.dtype, fused: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``h + delta`` (``delta`` None: ``h``) and its norm in ``dtype``; with ``fused`` (the CPU
    kernels) and a float32 RMSNorm on a float32 stream, one call of ``kernels.add_rms_norm`` (``h`` updated in
    place)."""
    w, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if (fused and eps is not None and w is not None and w.dtype == torch.float32 and h.dtype == torch.float32
            and dtype in (torch.float32, torch.bfloat16)):
        return h, kernels.add_rms_norm(h, delta, w, eps, dtype)
    if delta is not None:
        h = h + delta
    return h, _rms_norm(norm, h).to(dtype)


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A float32 RMSNorm module's output on float32 ``x`` from ``F.rms_norm`` (the same numbers as the module's
    own operations: ``tests/test_engine.py``); any other norm as the module computes it."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or w is None or x.dtype != torch.float32 or w.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), w, eps)
