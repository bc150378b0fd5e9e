"""One part of a split softmax attention: its output and log-sum-exp, and its backward from the merged result.

Cascade attention (``cascade.py``) and the rollout engine (``engine/decoder.py``) split a query's keys into
parts (a prompt's one copy, the branch's own keys) and attend each part alone. A part returns its output ``o_i``
and the log-sum-exp ``l_i`` of its scores; the parts merge exactly:

    lse = logaddexp(l_1, l_2),   o = o_1 exp(l_1 - lse) + o_2 exp(l_2 - lse).

The backward needs no kept scores. With the merged ``o`` and ``lse``, each part's probabilities under the joint
softmax are ``exp(s_i - lse)``, and ``D = rowsum(dO * o)`` is the joint softmax's term, so the standard
attention backward of each part, run with the merged ``o`` and ``lse`` in place of its own, gives that part's
exact share of ``dq`` (the parts' shares add up) and its keys' and values' whole gradients. The scores are
recomputed from ``q`` and ``k``, block by block.

Two kernels, one contract (``q (N, Hkv, Mq, D)`` against ``k, v (N, Hkv, S, D)``, an additive ``bias``
broadcastable to ``(N, Hkv, Mq, S)`` or None; grouped-query heads are stacked as query rows by the callers):

- on the CPU, torch's fused flash kernel and its backward (``aten._scaled_dot_product_flash_attention_for_cpu``
  and ``..._backward``), which already work in blocks and keep one log-sum-exp per query;
- elsewhere (and where that kernel is missing), plain matmuls over blocks of query rows with float32 scores, at
  most ``SCORE_BLOCK_BYTES`` of scores alive at a time: static shapes, no host synchronisation.
"""

from __future__ import annotations

import torch

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CPU_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
SCORE_BLOCK_BYTES = 64 * 2**20  # float32 scores alive at once in the blocked kernel (forward and backward)


def _fused(q: torch.Tensor) -> bool:
    return _FLASH_CPU is not None and _FLASH_CPU_BACKWARD is not None and q.device.type == "cpu"


def _blocks(q: torch.Tensor, S: int):
    """Slices of query rows whose float32 scores stay within ``SCORE_BLOCK_BYTES``."""
    N, Hkv, Mq, _ = q.shape
    rows = max(1, SCORE_BLOCK_BYTES // max(1, 4 * N * Hkv * S))
    return [slice(s, s + rows) for s in range(0, Mq, rows)]


def _bias_rows(bias: torch.Tensor | None, sl: slice) -> torch.Tensor | None:
    """The bias of the query rows ``sl`` (a bias of one query row broadcasts over all)."""
    if bias is None or bias.shape[-2] == 1:
        return bias
    return bias[..., sl, :]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q k^T scale + bias) v  # (N, Hkv, Mq, D) in q's dtype, lse  # (N, Hkv, Mq) float32)``.
    A query row whose keys are all masked has lse -inf and output 0 (then it merges to the other part)."""
    if _fused(q):
        return _FLASH_CPU(q, k, v, 0.0, False, attn_mask=None if bias is None else bias.to(q.dtype), scale=scale)
    S = k.shape[-2]
    out = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    kf, vf = k.float(), v.float()
    for sl in _blocks(q, S):
        s = torch.matmul(q[..., sl, :].float(), kf.transpose(-1, -2)) * scale
        b = _bias_rows(bias, sl)
        if b is not None:
            s = s + b.float()
        lse[..., sl] = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., sl, None]).nan_to_num_(0.0)  # rows with every key masked: 0, not nan
        out[..., sl, :] = torch.matmul(p, vf).to(q.dtype)
    return out, lse


def attend_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, bias: torch.Tensor | None, scale: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of this part, given the merged attention's ``out`` and ``lse`` (module docstring) and the
    gradient ``grad_out`` of the merged output; shapes as ``attend``'s inputs."""
    if _fused(q):
        return _FLASH_CPU_BACKWARD(grad_out.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
                                   lse.contiguous(), 0.0, False,
                                   attn_mask=None if bias is None else bias.to(q.dtype), scale=scale)
    S = k.shape[-2]
    kf, vf = k.float(), v.float()
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for sl in _blocks(q, S):
        qc, do = q[..., sl, :].float(), grad_out[..., sl, :].float()
        s = torch.matmul(qc, kf.transpose(-1, -2)) * scale
        b = _bias_rows(bias, sl)
        if b is not None:
            s = s + b.float()
        p = torch.exp(s - lse[..., sl, None]).nan_to_num_(0.0)  # this part's share of the joint softmax
        dv += torch.matmul(p.transpose(-1, -2), do)
        dp = torch.matmul(do, vf.transpose(-1, -2))
        delta = (do * out[..., sl, :].float()).sum(-1, keepdim=True)  # rowsum(dO * o) of the merged output
        ds = p * (dp - delta) * scale
        dq[..., sl, :] = torch.matmul(ds, kf)
        dk += torch.matmul(ds.transpose(-1, -2), qc)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def merge(o_1: torch.Tensor, l_1: torch.Tensor, o_2: torch.Tensor, l_2: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two parts' outputs ``(..., D)`` and log-sum-exps ``(...)`` -> the joint attention's, in float32."""
    lse = torch.logaddexp(l_1, l_2)
    w_1, w_2 = torch.exp(l_1 - lse).nan_to_num_(0.0), torch.exp(l_2 - lse).nan_to_num_(0.0)
    return o_1.float() * w_1[..., None] + o_2.float() * w_2[..., None], lse
