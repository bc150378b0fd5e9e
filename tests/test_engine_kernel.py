"""The native engine's CPU attention kernel (atgrpo/engine/kernels.py, decode_attention.cpp): each row's softmax
over its prompt's keys and its own keys against a float64 reference, float32 and bfloat16 (whose prompt part's
probabilities are rounded to bfloat16 before the values' sum, in the reference too), AVX-512 and generic
paths (a head dimension that is not a multiple of 16), prompts of different lengths, rows in any order; and the
decoder with the kernel against the decoder on torch's attention: the same tokens in float32."""

from __future__ import annotations

import pytest
import torch

from atgrpo.engine import kernels

pytestmark = pytest.mark.skipif(kernels.module() is None, reason=f"kernel not built: {kernels.available()[1]}")


def _pairs(dtype, D) -> bool:
    """Whether the kernels sum these values in pairs of keys, their probabilities rounded to bfloat16 first."""
    return dtype == torch.bfloat16 and D % 16 == 0 and kernels.module().bf16_pairs()


# where probabilities are rounded to bfloat16, a few fall the other way of a rounding boundary (the kernel's float32
# scores and exp differ from float64's in the last bits): up to ~3e-5 here, against ~3e-3 without the rounding
ROUNDED_ATOL = 2e-4


def _softmax_values(s, v, rounded):
    """softmax(s) @ v in float64 over keys ``s  # (..., n)``; the probabilities of the keys ``rounded`` (a mask
    over n) rounded to bfloat16 in the sum of values only, as the kernels round the prompt part's."""
    p = torch.exp(s - s.max(-1, keepdim=True).values)
    pv = torch.where(rounded, p.to(torch.bfloat16).double(), p)
    return (pv @ v.double()) / p.sum(-1, keepdim=True)


def _reference(q, pk, pv, plen, ok, ov, own_len, rows, scale):
    A, H, D = q.shape
    n_rep = H // pk.shape[1]
    out = torch.empty(A, H, D, dtype=torch.float64)
    for r in range(A):
        g, L = int(rows[r]), int(plen[rows[r]])
        rounded = torch.arange(L + own_len) < (L if _pairs(q.dtype, D) else 0)
        for h in range(H):
            kv = h // n_rep
            k = torch.cat([pk[g, kv, :L], ok[r, kv, :own_len]]).double()
            v = torch.cat([pv[g, kv, :L], ov[r, kv, :own_len]]).double()
            out[r, h] = _softmax_values(q[r, h].double() @ k.T * scale, v, rounded)
    return out.view(A, H * D)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 24])
def test_kernel_equals_one_softmax_over_both_parts(dtype, D):
    g = torch.Generator().manual_seed(D)
    G, Hkv, n_rep, P, T = 3, 2, 3, 53, 37
    rows = torch.tensor([2, 0, 0, 1, 2, 2, 0])  # any order; prompt 1 has one row
    plen = torch.tensor([53, 17, 1])
    A = len(rows)
    q = (3 * torch.randn(A, Hkv * n_rep, D, generator=g)).to(dtype)  # large scores: the softmax is peaked
    pk, pv = (torch.randn(G, Hkv, P, D, generator=g).to(dtype) for _ in range(2))
    ok, ov = (torch.randn(A, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    for own_len in (1, 16, 37):
        out = kernels.decode_attention(q, kernels.transpose_keys(pk), kernels.pair_values(pv), plen, ok, ov, own_len,
                                       rows, D ** -0.5)
        assert out.dtype == torch.float32 and out.shape == (A, Hkv * n_rep * D)
        expected = _reference(q, pk, pv, plen, ok, ov, own_len, rows, D ** -0.5)
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=ROUNDED_ATOL if _pairs(dtype, D) else 2e-6)


def test_keys_come_in_transposed_blocks_of_16():
    k = torch.randn(2, 3, 21, 8)
    kt = kernels.transpose_keys(k)
    assert kt.shape == (2, 3, 2, 8, 16) and kt.is_contiguous()
    assert torch.equal(kt[:, :, 0], k[:, :, :16].transpose(-1, -2))
    assert torch.equal(kt[:, :, 1, :, :5], k[:, :, 16:].transpose(-1, -2)) and not kt[:, :, 1, :, 5:].any()
    if kernels.module().bf16_pairs():  # bfloat16: dimensions 2i and 2i + 1 of 16 keys side by side
        kb = kernels.transpose_keys(k.bfloat16())
        assert kb.shape == (2, 3, 2, 8, 16)
        pairs = kb[:, :, 0].reshape(2, 3, 4, 16, 2)
        assert torch.equal(pairs[:, :, 1, 3], k[:, :, 3, 2:4].bfloat16())


def test_decoder_tokens_with_and_without_the_kernel(monkeypatch):
    from atgrpo.engine.native import native_generate
    from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model

    policy = CausalLMPolicy("p", build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4,
                                                                  intermediate_size=96), 3), ByteTokenizer())
    prompts = [[1] + list(range(40, 40 + n)) for n in (30, 9, 51)]
    runs = {}
    for name in ("kernel", "torch"):
        if name == "torch":
            monkeypatch.setitem(kernels._state, "module", None)
        decoder = policy.decoder()
        st = decoder.new_state(*decoder.prefill(prompts, "cpu")[1:], 3, 4)
        assert (st.prompt_kt is not None) == (name == "kernel")
        runs[name] = native_generate(policy, decoder, prompts, 4, 1.0, 24, torch.Generator().manual_seed(7))
    assert torch.equal(runs["kernel"][0], runs["torch"][0])
    torch.testing.assert_close(runs["kernel"][1], runs["torch"][1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_equals_causal_attention_per_prompt(dtype):
    g = torch.Generator().manual_seed(5)
    Hkv, n_rep, D = 2, 3, 32
    lens = [37, 1, 16, 20]
    N, G, P = sum(lens), len(lens), max(lens)
    starts = [sum(lens[:i]) for i in range(G)]
    q = (2 * torch.randn(N, Hkv * n_rep, D, generator=g)).to(dtype)
    k, v = (torch.randn(N, Hkv, D, generator=g).to(dtype) for _ in range(2))
    pk, pv = k.new_zeros((G, Hkv, P, D)), v.new_zeros((G, Hkv, P, D))
    for i, (s0, n) in enumerate(zip(starts, lens)):
        pk[i, :, :n], pv[i, :, :n] = k[s0:s0 + n].transpose(0, 1), v[s0:s0 + n].transpose(0, 1)
    out = kernels.prefill_attention(q, kernels.transpose_keys(pk), kernels.pair_values(pv), torch.tensor(lens),
                                    torch.tensor(starts), D ** -0.5)
    for s0, n in zip(starts, lens):
        qs = q[s0:s0 + n].double().transpose(0, 1)  # (H, n, D)
        ks, vs = (x[s0:s0 + n].double().transpose(0, 1).repeat_interleave(n_rep, 0) for x in (k, v))
        scores = (qs @ ks.transpose(-1, -2) * D ** -0.5).masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        expected = _softmax_values(scores, vs, torch.full((n,), _pairs(dtype, D)))
        torch.testing.assert_close(out[s0:s0 + n].double(), expected.transpose(0, 1).reshape(n, -1), rtol=0,
                                   atol=ROUNDED_ATOL if _pairs(dtype, D) else 2e-6)


def test_values_come_in_pairs_of_keys_for_the_bfloat16_dot_products():
    v = torch.randn(2, 3, 21, 16)
    assert kernels.pair_values(v) is v  # float32: as it is
    if not kernels.module().bf16_pairs():
        pytest.skip("no AVX512-BF16 here: values stay as they are")
    vp = kernels.pair_values(v.bfloat16())
    assert vp.shape == (2, 3, 32, 16) and vp.is_contiguous()
    pairs = vp.view(2, 3, 16, 16, 2)  # (key pair, dimension, key of the pair)
    assert torch.equal(pairs[:, :, 4, :, 1], v[:, :, 9].bfloat16())
    assert torch.equal(pairs[:, :, 10, :, 0], v[:, :, 20].bfloat16())  # the last key; zeros after it
    assert not pairs[:, :, 10, :, 1].any() and not pairs[:, :, 11:].any()


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_rotate_write_is_the_torch_operations_bit_for_bit(dtypes):
    """The rotation of queries and keys and the cache write, against the decoder's torch path (float32 products
    rounded before the sum, then cast); keys and values land at position t only."""
    dt, cache_dt = dtypes
    g = torch.Generator().manual_seed(1)
    A, H, Hkv, D, T, t = 5, 6, 2, 64, 9, 4
    qkv = torch.randn(A, H + 2 * Hkv, D, generator=g).to(dt)
    cos, sin = torch.randn(A, 1, D, generator=g), torch.randn(A, 1, D, generator=g)
    own_k, own_v = torch.zeros(A, Hkv, T, D, dtype=cache_dt), torch.zeros(A, Hkv, T, D, dtype=cache_dt)
    q = kernels.rotate_write(qkv[:, :H + Hkv], qkv[:, H + Hkv:], cos, sin, own_k, own_v, t)
    qk = qkv[:, :H + Hkv]
    expected = (qk * cos + qk.roll(D // 2, -1) * sin).to(cache_dt)
    assert q.dtype == cache_dt and torch.equal(q, expected[:, :H])
    assert torch.equal(own_k[:, :, t], expected[:, H:]) and torch.equal(own_v[:, :, t], qkv[:, H + Hkv:].to(cache_dt))
    assert not own_k[:, :, :t].any() and not own_v[:, :, t + 1:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_is_silu_then_the_product(dtype):
    """Against F.silu(g) * u (torch's two operations): float32 within a few ulps (another exp), bfloat16 equal but
    for a rounding that falls the other way; very negative and positive gates and a tail past a multiple of 16."""
    g = torch.Generator().manual_seed(3)
    gu = (4 * torch.randn(6, 2 * 40, generator=g)).to(dtype)
    gu[0, :3] = torch.tensor([-100.0, 100.0, 0.0]).to(dtype)
    gate, up = gu.chunk(2, -1)
    expected = torch.nn.functional.silu(gate) * up
    got = kernels.silu_mul(gu)
    assert got.dtype == dtype and got.shape == (6, 40)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=3e-7, atol=1e-7)
    else:
        ulp = (expected.float().abs() * 2 ** -7).clamp_min(1e-30)
        assert ((got.float() - expected.float()).abs() <= ulp).all()
        assert (got == expected).float().mean() > 0.97


@pytest.mark.parametrize("delta_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_add_rms_norm_equals_the_add_then_rms_norm(delta_dtype, out):
    g = torch.Generator().manual_seed(2)
    h = torch.randn(7, 96, generator=g)
    delta = None if delta_dtype is None else torch.randn(7, 96, generator=g).to(delta_dtype)
    w = torch.randn(96, generator=g)
    expected_h = h if delta is None else h + delta.float()
    expected = torch.nn.functional.rms_norm(expected_h, (96,), w, 1e-5)
    got = kernels.add_rms_norm(h, delta, w, 1e-5, out)  # h updated in place
    torch.testing.assert_close(h, expected_h, rtol=0, atol=0)
    assert got.dtype == out
    torch.testing.assert_close(got.float(), expected.to(out).float(), rtol=1e-5 if out == torch.float32 else 1e-2,
                               atol=1e-5)
