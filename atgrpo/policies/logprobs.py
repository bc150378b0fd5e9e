"""Token log-probabilities from logits, ``log softmax(logits / T)[target]``, with a hand-written backward.

``token_logprobs`` scores logits that exist. Its forward walks the logits in chunks of
``LOGPROB_CHUNK_ROWS`` positions: the softmax of each chunk (kept for the backward, in one float32 buffer of the
logits' size) and its log-sum-exp; the target's scaled logit minus the log-sum-exp is the result. Its backward is
one pass: ``d logp / d logits = (onehot(target) - softmax) / T``, written into the kept softmax in place.

Built from autograd's own pieces (chunk slices, ``gather``, ``logsumexp``) the same computation's backward
zero-filled a logits-sized gradient for every chunk slice and every gather, added them up, and recomputed
``exp(x - lse)`` from the saved logits: on SmolLM2-135M's 49k-token vocabulary, 258 ms per 505-position
micro-batch against 60 ms here (``python benchmarks/head_cost.py``; docs/performance.md, "The LM head and the
loss's log-probs").

The loss and the warm start go through ``model_logprobs`` instead, which fuses the LM head into the same
computation (``head_logprobs``): the model's forward returns its final hidden states, and the logits are made
chunk by chunk from them and the head's weight, in the forward and again in the backward, so the logits of all
positions (positions x vocabulary x 8 bytes with the kept softmax: 0.47 GB for 1,205 positions of SmolLM2's
49k vocabulary, 13.9 GiB for Qwen3's 152k at 12,283) never exist. ``token_logprobs`` remains for heads that cannot
be fused (adapters or hooks on the head) and for logits from elsewhere.

``rows`` lets many targets read one position's logits (the K responses to one prompt all predict their first
token from the prompt's last position) without copying that row K times: the softmax is taken once per
position, and the backward sums the weights of the targets that read it.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F

from ..plan_memory import HEAD_CHUNK_BYTES  # float32 logits of one chunk of positions in ``head_logprobs``
from .precision import _exact_head_forward

LOGPROB_CHUNK_ROWS = 256  # positions per chunk of the forward: bounds its temporaries
HEAD_VOCAB_BLOCK = 8192  # vocabulary entries per block of ``head_logprobs``' backward: bounds its temporaries


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """``log softmax(logits / T)[target]`` in float32, shaped like ``targets``.

    Without ``rows``: ``logits  # (..., V)``, ``targets  # (...)``, each target read from its own position.
    With ``rows`` (same shape as ``targets``): each target read from position ``rows[i]`` of ``logits`` flattened
    to ``(N, V)``. Equal to ``log_softmax(...).gather(...)`` up to float rounding, gradients too."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    if rows is None:
        if tuple(targets.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"targets {tuple(targets.shape)} must match the logits' positions "
                             f"{tuple(logits.shape[:-1])}")
        rows = torch.arange(flat.shape[0], device=flat.device)
    elif rows.shape != targets.shape:
        raise ValueError(f"rows {tuple(rows.shape)} and targets {tuple(targets.shape)} must have one shape")
    out = _TokenLogprobs.apply(flat, rows.reshape(-1), targets.reshape(-1), float(temperature))
    return out.view(targets.shape)


class _TokenLogprobs(torch.autograd.Function):
    """``(flat  # (N, V), rows  # (B,), targets  # (B,), T)`` -> ``(B,)`` float32 (see ``token_logprobs``)."""

    @staticmethod
    def forward(ctx, flat, rows, targets, temperature):
        T = max(temperature, 1e-6)
        N, V = flat.shape
        keep = ctx.needs_input_grad[0]
        probs = flat.new_empty((N, V), dtype=torch.float32) if keep else None
        lse = flat.new_empty(N, dtype=torch.float32)
        for s in range(0, N, LOGPROB_CHUNK_ROWS):
            x = flat[s:s + LOGPROB_CHUNK_ROWS].float()  # float32 logits: a view, nothing copied
            if T != 1.0:
                x = x / T
            if keep:
                m = x.amax(-1, keepdim=True)
                p = probs[s:s + LOGPROB_CHUNK_ROWS]
                torch.sub(x, m, out=p).exp_()
                z = p.sum(-1, keepdim=True)
                p.div_(z)
                lse[s:s + LOGPROB_CHUNK_ROWS] = (m + z.log()).squeeze(1)
            else:
                lse[s:s + LOGPROB_CHUNK_ROWS] = torch.logsumexp(x, -1)
        out = flat[rows, targets].float() / T - lse[rows]
        if keep:
            ctx.save_for_backward(probs, rows, targets)
            ctx.temperature, ctx.dtype, ctx.spent = T, flat.dtype, False
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.spent:
            raise RuntimeError("token_logprobs: its backward reuses the kept softmax in place; it runs once per "
                               "forward (no retain_graph)")
        ctx.spent = True
        probs, rows, targets = ctx.saved_tensors
        g = grad_out.float() / ctx.temperature
        weight = torch.zeros(probs.shape[0], device=g.device).index_add_(0, rows, g)  # per position: its targets'
        grad = probs.mul_(-weight[:, None])  # - p * (sum of the weights of the targets read there) / T
        grad.index_put_((rows, targets), g, accumulate=True)  # + onehot(target) * weight / T
        return grad.to(ctx.dtype), None, None, None


# ---- the LM head fused into the log-probs ---------------------------------------------------------------------

def model_logprobs(model, forward: Callable[[], torch.Tensor], targets: torch.Tensor, temperature: float,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """``token_logprobs`` of the logits ``forward()`` returns (a call of ``model``), with the LM head fused into
    the log-probs where it is a plain linear layer: ``forward`` then runs with the head bypassed, so it returns
    the head's input (the final hidden states, ``(..., hidden)``), and ``head_logprobs`` computes the logits
    chunk by chunk, never all at once, in the forward and again in the backward. Elsewhere (a head with adapters
    or a custom forward), the logits as they come."""
    head = fusable_head(model)
    if head is None:
        return token_logprobs(forward(), targets, temperature, rows=rows)
    with _bypassed(head):
        hidden = forward()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    autocast = getattr(base, "atgrpo_autocast", None)  # (device type, dtype) under model.autocast
    return head_logprobs(hidden, head, targets, temperature, rows=rows,
                         grad_dtype=autocast[1] if autocast is not None else None)


def fusable_head(model) -> torch.nn.Linear | None:
    """``model``'s output layer if it is a plain ``nn.Linear`` (its own forward, or the exact-precision one of
    ``precision.apply_autocast``) without hooks, else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(base, "get_output_embeddings", None)
    head = get() if get is not None else None
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return None  # another layer, or hooks that change its logits: run it as it is
    own = head.__dict__.get("forward")  # None, or the head under autocast: its weights' dtype, autocast off
    return head if own is None or getattr(own, "__func__", None) is _exact_head_forward else None


@contextlib.contextmanager
def _bypassed(head: torch.nn.Linear):
    """Within: ``head`` returns its input (the model's forward returns the hidden states as its logits)."""
    had = "forward" in head.__dict__
    own = head.__dict__.get("forward")
    head.forward = _identity
    try:
        yield
    finally:
        if had:
            head.forward = own
        else:
            del head.forward


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float,
                  rows: torch.Tensor | None = None, grad_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``token_logprobs(head(hidden), ...)`` without the logits of all positions: ``hidden  # (..., E)`` the
    head's input, ``targets`` and ``rows`` as in ``token_logprobs``. The logits are computed in chunks of
    positions (``HEAD_CHUNK_BYTES`` of float32 logits each) in the head's weight dtype with autocast off, as
    the head computes them; the backward recomputes each chunk's logits from ``hidden`` and the weight, so at most
    one chunk of logits is alive. Gradients reach ``hidden``, the weight and the bias.

    ``grad_dtype`` (the autocast dtype of a ``model.autocast`` run): the backward's two gradient matmuls run in
    it, as autocast runs every other matmul of the backward, while the logits (forward and recomputed) stay in
    the weights' dtype, so the log-probs and the softmax in the gradient are exact."""
    E = hidden.shape[-1]
    flat = hidden.reshape(-1, E)
    if rows is None:
        if tuple(targets.shape) != tuple(hidden.shape[:-1]):
            raise ValueError(f"targets {tuple(targets.shape)} must match the positions {tuple(hidden.shape[:-1])}")
        rows = torch.arange(flat.shape[0], device=flat.device)
    elif rows.shape != targets.shape:
        raise ValueError(f"rows {tuple(rows.shape)} and targets {tuple(targets.shape)} must have one shape")
    out = _HeadLogprobs.apply(flat, head.weight, head.bias, rows.reshape(-1), targets.reshape(-1),
                              float(temperature), grad_dtype)
    return out.view(targets.shape)


class _HeadLogprobs(torch.autograd.Function):
    """``(hidden  # (N, E), weight  # (V, E), bias  # (V,) or None, rows  # (B,), targets  # (B,), T)`` ->
    ``(B,)`` float32 log-probs (``head_logprobs``). Keeps ``hidden``, the weight and one log-sum-exp per
    position."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, rows, targets, temperature, grad_dtype):
        T = max(temperature, 1e-6)
        N, V = hidden.shape[0], weight.shape[0]
        chunk = max(16, HEAD_CHUNK_BYTES // (4 * V))  # plan_memory.head_chunk_rows
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)
        out = torch.empty(rows.shape, dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s, sel, local in _chunks(rows, N, chunk):
                z = _chunk_logits(hidden[s], weight, bias, T)  # (n, V) float32
                lse[s] = torch.logsumexp(z, -1)
                out[sel] = z[local, targets[sel]] - lse[s][local]
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(hidden, weight, bias, rows, targets, lse)
            ctx.temperature, ctx.chunk, ctx.grad_dtype = T, chunk, grad_dtype or weight.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, rows, targets, lse = ctx.saved_tensors
        T, N = ctx.temperature, hidden.shape[0]
        g = grad_out.float() / T  # d logp / d logits = (onehot(target) - softmax) / T
        weight_sum = torch.zeros(N, device=g.device).index_add_(0, rows, g)  # per position: its targets' weights
        d_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        d_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) \
            if bias is not None and ctx.needs_input_grad[2] else None
        gdt = ctx.grad_dtype
        w_low = weight.to(gdt)  # the weight in the gradient matmuls' dtype (itself when that is its own)
        V, B = weight.shape[0], HEAD_VOCAB_BLOCK
        with torch.autocast(hidden.device.type, enabled=False):
            for s, sel, local in _chunks(rows, N, ctx.chunk):
                x, tgt, g_sel = hidden[s], targets[sel], g[sel]
                x_low = x.to(gdt)
                d_x = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if d_hidden is not None else None
                for v in range(0, V, B):  # a block of the vocabulary at a time: its logits are all that is alive
                    block = slice(v, v + B)
                    dz = _chunk_logits(x, weight[block], None if bias is None else bias[block], T)
                    dz.sub_(lse[s, None]).exp_().mul_(-weight_sum[s, None])  # - softmax * weight
                    hit = (tgt >= v) & (tgt < v + B)
                    dz.index_put_((local[hit], tgt[hit] - v), g_sel[hit], accumulate=True)  # + onehot(target) * weight
                    dz = dz.to(gdt)
                    if d_x is not None:
                        d_x += dz @ w_low[block]
                    if d_weight is not None:  # summed in float32 over the chunks
                        if dz.dtype == torch.float32:
                            d_weight[block].addmm_(dz.t(), x_low)
                        else:
                            d_weight[block].add_(dz.t() @ x_low)
                    if d_bias is not None:
                        d_bias[block].add_(dz.sum(0))
                if d_hidden is not None:
                    d_hidden[s] = d_x.to(hidden.dtype)
        return (d_hidden, None if d_weight is None else d_weight.to(weight.dtype),
                None if d_bias is None else d_bias.to(bias.dtype), None, None, None, None)


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, T: float) -> torch.Tensor:
    """One chunk's logits as the head computes them (its weights' dtype), in float32, divided by ``T``."""
    z = F.linear(x.to(weight.dtype), weight, bias).float()
    return z.div_(T) if T != 1.0 else z


def _chunks(rows: torch.Tensor, N: int, chunk: int):
    """``(positions slice, targets read there, their rows within the slice)`` per chunk of ``chunk`` positions."""
    order = torch.argsort(rows, stable=True)
    bounds = torch.searchsorted(rows[order], torch.arange(0, N + chunk, chunk, device=rows.device)).tolist()
    for i, s0 in enumerate(range(0, N, chunk)):
        sel = order[bounds[i]:bounds[i + 1]]
        yield slice(s0, s0 + chunk), sel, rows[sel] - s0
