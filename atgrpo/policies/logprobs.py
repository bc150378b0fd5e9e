"""Token log-probabilities from logits, ``log softmax(logits / T)[target]``, with a hand-written backward.

Every log-prob of the loss goes through ``token_logprobs``. Its forward walks the logits in chunks of
``LOGPROB_CHUNK_ROWS`` positions: the softmax of each chunk (kept for the backward, in one float32 buffer of the
logits' size) and its log-sum-exp; the target's scaled logit minus the log-sum-exp is the result. Its backward is
one pass: ``d logp / d logits = (onehot(target) - softmax) / T``, written into the kept softmax in place.

Built from autograd's own pieces (chunk slices, ``gather``, ``logsumexp``) the same computation's backward
zero-filled a logits-sized gradient for every chunk slice and every gather, added them up, and recomputed
``exp(x - lse)`` from the saved logits: on SmolLM2-135M's 49k-token vocabulary, 258 ms per 505-position
micro-batch against 60 ms here (``python benchmarks/head_cost.py``; docs/performance.md, "The LM head and the
loss's log-probs").

``rows`` lets many targets read one position's logits (the K responses to one prompt all predict their first
token from the prompt's last position) without copying that row K times: the softmax is taken once per
position, and the backward sums the weights of the targets that read it.
"""

from __future__ import annotations

import torch

LOGPROB_CHUNK_ROWS = 256  # positions per chunk of the forward: bounds its temporaries


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
