"""Split attention (``attention_part``) and cascade attention's autograd (``cascade._TwoPart``): outputs and
gradients against plain softmax attention over the joined keys, on the fused CPU kernel and the blocked kernel."""

from __future__ import annotations

import pytest
import torch

from atgrpo.policies import attention_part
from atgrpo.policies.cascade import Branches, two_part_attention


def _plain(query, prompt_k, prompt_v, own_k, own_v, prompt_mask, row_prompt, scale, n_rep):
    """Each branch's queries against its prompt's real keys then its own keys (causal), one softmax, float64."""
    R, H, M, D = query.shape
    S = own_k.shape[-2]
    out = []
    for r in range(R):
        g = int(row_prompt[r])
        real = prompt_mask[g].bool()
        k = torch.cat([prompt_k[g][:, real], own_k[r]], 1).double().repeat_interleave(n_rep, 0)  # (H, P_g + S, D)
        v = torch.cat([prompt_v[g][:, real], own_v[r]], 1).double().repeat_interleave(n_rep, 0)
        s = query[r].double() @ k.transpose(-1, -2) * scale  # (H, M, P_g + S)
        allowed = torch.arange(S) <= torch.arange(S - M, S)[:, None]  # (M, S)
        s[..., int(real.sum()):] = s[..., int(real.sum()):].masked_fill(~allowed, float("-inf"))
        out.append(torch.softmax(s, -1) @ v)
    return torch.stack(out)


def _case(row_prompt, M, S, dtype, seed=0, H=4, Hkv=2, D=8, lens=(7, 4, 9)):
    g = torch.Generator().manual_seed(seed)
    G, P = len(lens), max(lens)
    mask = (torch.arange(P) < torch.tensor(lens)[:, None]).long()
    R = len(row_prompt)
    t = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in
         ((R, H, M, D), (G, Hkv, P, D), (G, Hkv, P, D), (R, Hkv, S, D), (R, Hkv, S, D))]
    return t, mask, torch.tensor(row_prompt)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("rows,M,S", [([0, 0, 1, 1, 2, 2], 5, 5), ([0, 0, 0, 1, 2, 2], 5, 5),
                                      ([0, 1, 1, 2], 1, 6), ([0, 0, 2], 3, 3)])
def test_two_part_attention_gradients_equal_plain_attention(monkeypatch, fused, rows, M, S):
    """float32: output and every input's gradient within 1e-5 of one softmax over the joined keys, for equal and
    unequal groups (absent slots), decode (M = 1) and training (M = S) shapes, grouped-query heads; on the fused
    CPU kernel and on the blocked kernel with blocks of a few rows."""
    if not fused:
        monkeypatch.setattr(attention_part, "_FLASH_CPU", None)
        monkeypatch.setattr(attention_part, "SCORE_BLOCK_BYTES", 4 * 2 * 3 * 9 * 2)  # 2 query rows per block
    (q, pk, pv, ok, ov), mask, row_prompt = _case(rows, M, S, torch.float32)
    br = Branches(mask, row_prompt)
    out = two_part_attention(br, q, pk, pv, ok, ov, 0.3, 2)
    ref = _plain(q, pk, pv, ok, ov, mask, row_prompt, 0.3, 2)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), (q, pk, pv, ok, ov))
    refs = torch.autograd.grad((ref * w.double()).sum(), (q, pk, pv, ok, ov))
    for a, b in zip(grads, refs):
        assert torch.allclose(a.double(), b.double(), atol=1e-5)


def test_two_part_attention_bfloat16_within_rounding():
    """bfloat16 inputs: output and gradients within bfloat16 rounding of the float64 reference."""
    (q, pk, pv, ok, ov), mask, row_prompt = _case([0, 0, 1, 1, 2, 2], 5, 5, torch.bfloat16)
    br = Branches(mask, row_prompt)
    out = two_part_attention(br, q, pk, pv, ok, ov, 0.3, 2)
    ref = _plain(q, pk, pv, ok, ov, mask, row_prompt, 0.3, 2)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.double(), ref, atol=3e-2)
    grads = torch.autograd.grad(out.float().sum(), (q, pk, pv, ok, ov))
    refs = torch.autograd.grad(ref.sum(), (q, pk, pv, ok, ov))
    for a, b in zip(grads, refs):
        assert a.dtype == torch.bfloat16 and torch.allclose(a.double(), b.double(), atol=5e-2)


def test_two_part_attention_keeps_nothing_of_the_scores_size():
    """With gradients, the tensors autograd keeps are the inputs, the output and one log-sum-exp per query: none
    has a (queries x keys) shape."""
    (q, pk, pv, ok, ov), mask, row_prompt = _case([0, 0, 1, 1, 2, 2], 5, 5, torch.float32)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: kept.append(tuple(x.shape)) or x, lambda x: x):
        two_part_attention(Branches(mask, row_prompt), q, pk, pv, ok, ov, 0.3, 2)
    R, H, M, D = q.shape
    assert kept and all(s[-1] == D or s == (R, H, M) for s in kept), kept  # vectors of D, or one lse per query


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_kernel_equals_the_fused_kernel(monkeypatch, dtype):
    """The blocked kernel (off the CPU; what CUDA graphs capture) gives the fused CPU kernel's outputs,
    log-sum-exps and gradients, with a padding bias and several blocks."""
    if attention_part._FLASH_CPU is None:
        pytest.skip("this torch has no fused CPU attention kernel")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for shape in ((3, 2, 6, 8), (3, 2, 11, 8), (3, 2, 11, 8)))
    bias = torch.zeros((3, 1, 1, 11)).masked_fill(torch.arange(11) >= torch.tensor([11, 7, 4])[:, None, None, None],
                                                  float("-inf"))
    do = torch.randn(q.shape, generator=g).to(dtype)
    fused = attention_part.attend(q, k, v, bias, 0.3)
    fused_bw = attention_part.attend_backward(do, q, k, v, *fused, bias, 0.3)
    monkeypatch.setattr(attention_part, "_FLASH_CPU", None)
    monkeypatch.setattr(attention_part, "SCORE_BLOCK_BYTES", 4 * 3 * 2 * 11 * 4)  # 4 query rows per block
    blocked = attention_part.attend(q, k, v, bias, 0.3)
    blocked_bw = attention_part.attend_backward(do, q, k, v, *fused, bias, 0.3)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert blocked[0].dtype == fused[0].dtype and torch.allclose(blocked[0].float(), fused[0].float(), atol=tol)
    assert torch.allclose(blocked[1], fused[1], atol=1e-4)
    for a, b in zip(blocked_bw, fused_bw):
        assert a.dtype == b.dtype and torch.allclose(a.float(), b.float(), atol=tol * 5)
