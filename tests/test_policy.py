"""Policies (atgrpo/policies): byte tokenizer, tiny model, batched sampling and response log-probs.

The central property (docs/method.md, pitfall 4): the log-probs stored at sampling time are those of the
distribution that was sampled, softmax(logits / T), and equal what the loss recomputes.
"""

from __future__ import annotations

import math

import pytest
import torch

from atgrpo.policies import ByteTokenizer, CausalLMPolicy, Completion, TinyModelConfig, build_tiny_model
from atgrpo.policies.tokenizer import BOS, EOS, OFFSET, PAD, VOCAB_SIZE

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["x", "hello world", "a much longer prompt, with punctuation! and more words"]


def _policy(seed: int = 0, cfg: TinyModelConfig = TINY) -> CausalLMPolicy:
    return CausalLMPolicy("p", build_tiny_model(cfg, seed), ByteTokenizer())


def _bias_logits(policy: CausalLMPolicy, bias: dict[int, float]):
    """Add a fixed bias to the model's output logits (lm_head output), for generate and scoring alike."""
    vec = torch.zeros(VOCAB_SIZE)
    for t, b in bias.items():
        vec[t] = b
    return policy.model.lm_head.register_forward_hook(lambda mod, inp, out: out + vec.to(out.dtype))


# ---- tokenizer -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "hello", "héllo wörld ✓ 🤖 中文", "tab\tnew\nline \x00 nul", "#.A\nG>"])
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(OFFSET <= i < VOCAB_SIZE for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    with_bos = tok.encode(text, add_bos=True)
    assert with_bos == [BOS] + ids and tok.decode(with_bos) == text
    assert tok.decode([PAD, BOS] + ids + [EOS, PAD]) == text  # special ids are dropped


def test_byte_tokenizer_junk_bytes():
    tok = ByteTokenizer()
    junk = bytes([0xFF, 0xFE, 0x41, 0xC3, 0x80, 0xE2, 0x82])  # invalid, 'A', 'À', truncated sequence
    ids = [b + OFFSET for b in junk]
    assert tok.decode(ids) == junk.decode("utf-8", errors="replace")
    assert "A" in tok.decode(ids) and "\ufffd" in tok.decode(ids)
    for b in range(256):  # every single byte decodes without raising
        tok.decode([b + OFFSET])
    assert tok.decode(torch.tensor(ids)) == tok.decode(ids)
    assert tok.encode("\ud800x")  # a lone surrogate is encodable (replaced), never raises
    assert VOCAB_SIZE == 259 and (PAD, BOS, EOS) == (0, 1, 2)


def test_tiny_model_deterministic_per_seed():
    a, b, c = build_tiny_model(TINY, 3), build_tiny_model(TINY, 3), build_tiny_model(TINY, 4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.vocab_size == VOCAB_SIZE


def test_render_encode():
    pol = _policy()
    assert pol.render("abc") == "abc"
    text = pol.render([{"role": "user", "content": "hi"}])
    assert "hi" in text
    assert pol.encode("ab") == [BOS, ord("a") + OFFSET, ord("b") + OFFSET]
    small = CausalLMPolicy("p", build_tiny_model(TINY, 0), ByteTokenizer(), max_prompt_tokens=4)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        small.encode("too long for four")


# ---- generation ------------------------------------------------------------------------------------------
def _check_completion_invariants(policy: CausalLMPolicy, comps: list[list[Completion]], B: int, n: int,
                                 max_new: int, sampled: bool) -> None:
    assert len(comps) == B and all(len(row) == n for row in comps)
    for row in comps:
        for c in row:
            assert 1 <= len(c.ids) <= max_new
            assert c.finished == (c.ids[-1] == EOS)
            assert EOS not in c.ids[:-1]  # nothing generated after EOS
            assert c.text == policy.decode(c.ids)
            if sampled:
                assert len(c.logprobs) == len(c.ids) and all(lp <= 1e-6 for lp in c.logprobs)
            else:
                assert c.logprobs == []
            if not c.finished:
                assert len(c.ids) == max_new


def _recomputed(policy, prompt_ids, comps, n, temperature):
    P = [p for p in prompt_ids for _ in range(n)]
    R = [c.ids for row in comps for c in row]
    with torch.no_grad():
        logp, mask = policy.response_logprobs(P, R, temperature)
    stored = torch.zeros_like(logp)
    for i, c in enumerate(c for row in comps for c in row):
        stored[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    return logp, mask, stored


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_logprobs_equal_recomputed(temperature):
    pol = _policy(1)
    ids = [pol.encode(p) for p in PROMPTS]
    n, max_new = 4, 20
    comps = pol.generate(ids, n, temperature, max_new, torch.Generator().manual_seed(0))
    _check_completion_invariants(pol, comps, len(PROMPTS), n, max_new, sampled=True)
    logp, mask, stored = _recomputed(pol, ids, comps, n, temperature)
    assert torch.allclose(logp, stored, atol=1e-4), (logp - stored).abs().max()
    assert mask.sum().item() == sum(len(c.ids) for row in comps for c in row)
    # the stored log-probs are those of softmax(logits / T) at *this* T: another T gives other values
    other, _, _ = _recomputed(pol, ids, comps, n, 2.0 * temperature)
    assert not torch.allclose(other, stored, atol=1e-2)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_logprobs_with_rows_stopping_early(temperature):
    """EOS made likely: rows finish at different steps and are dropped from the KV cache mid-generation."""
    pol = _policy(2)
    handle = _bias_logits(pol, {EOS: 3.5})
    try:
        ids = [pol.encode(p) for p in PROMPTS]
        n, max_new = 6, 30
        comps = pol.generate(ids, n, temperature, max_new, torch.Generator().manual_seed(1))
        _check_completion_invariants(pol, comps, len(PROMPTS), n, max_new, sampled=True)
        lengths = {len(c.ids) for row in comps for c in row}
        finished = [c.finished for row in comps for c in row]
        assert any(finished) and len(lengths) >= 4  # rows really stopped at different steps
        logp, _, stored = _recomputed(pol, ids, comps, n, temperature)
        assert torch.allclose(logp, stored, atol=1e-4), (logp - stored).abs().max()
    finally:
        handle.remove()


def test_eos_stops_rows_random_model():
    pol = _policy(0, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    ids = [pol.encode(p) for p in PROMPTS]
    comps = pol.generate(ids, 8, 1.0, 30, torch.Generator().manual_seed(5))
    _check_completion_invariants(pol, comps, len(PROMPTS), 8, 30, sampled=True)


def test_greedy_alone_equals_batched():
    pol = _policy(3)
    ids = [pol.encode(p) for p in PROMPTS]
    batched = pol.generate(ids, 2, 0.0, 24)
    _check_completion_invariants(pol, batched, len(PROMPTS), 2, 24, sampled=False)
    for i, p in enumerate(ids):
        alone = pol.generate([p], 1, 0.0, 24)[0][0]
        assert batched[i][0].ids == alone.ids
        assert batched[i][1].ids == alone.ids  # greedy: all n copies identical
    # greedy is the argmax of the model's next-token logits on the unpadded prompt
    with torch.no_grad():
        logits = pol.model(input_ids=torch.tensor([ids[2]])).logits[0, -1]
    assert batched[2][0].ids[0] == int(logits.argmax())


def test_greedy_rows_with_eos_stop():
    pol = _policy(3)
    ids = [pol.encode(p) for p in PROMPTS]
    base = pol.generate(ids, 1, 0.0, 12)
    # force EOS as the greedy choice right away for every prompt: generation stops after one token
    handle = _bias_logits(pol, {EOS: 100.0})
    try:
        out = pol.generate(ids, 3, 0.0, 12)
    finally:
        handle.remove()
    assert all(c.ids == [EOS] and c.finished and c.text == "" for row in out for c in row)
    assert all(not c.finished or c.ids[-1] == EOS for row in base for c in row)


def test_fixed_seed_reproducible():
    pol = _policy(4)
    ids = [pol.encode(p) for p in PROMPTS]
    a = pol.generate(ids, 3, 1.0, 16, torch.Generator().manual_seed(123))
    b = pol.generate(ids, 3, 1.0, 16, torch.Generator().manual_seed(123))
    c = pol.generate(ids, 3, 1.0, 16, torch.Generator().manual_seed(124))
    flat = lambda comps: [(x.ids, x.logprobs) for row in comps for x in row]  # noqa: E731
    assert flat(a) == flat(b)
    assert [x for x, _ in flat(a)] != [x for x, _ in flat(c)]
    # branches of one prompt are distinct samples, not copies
    assert len({tuple(x.ids) for x in a[2]}) > 1


def test_generate_restores_training_mode_and_empty_input():
    pol = _policy(0)
    pol.model.train()
    pol.generate([pol.encode("hi")], 2, 1.0, 3, torch.Generator().manual_seed(0))
    assert pol.model.training
    pol.model.eval()
    pol.generate([pol.encode("hi")], 2, 1.0, 3, torch.Generator().manual_seed(0))
    assert not pol.model.training
    assert pol.generate([], 4, 1.0, 3) == []


def test_response_logprobs_has_gradients_and_masks():
    pol = _policy(0)
    P = [pol.encode("ab"), pol.encode("a longer prompt")]
    R = [[10, 11, 12, EOS], [20]]
    logp, mask = pol.response_logprobs(P, R, 1.0)
    assert logp.shape == (2, 4) and mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert (logp[1, 1:] == 0).all() and (logp[mask.bool()] < 0).all()
    logp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.model.parameters())
    # row-independent: scoring a row alone gives the same values as in the ragged batch
    with torch.no_grad():
        alone, _ = pol.response_logprobs([P[1]], [R[1]], 1.0)
        batch, _ = pol.response_logprobs(P, R, 1.0)
    assert torch.allclose(alone[0, :1], batch[1, :1], atol=1e-5)


# ---- the sampling distribution ---------------------------------------------------------------------------
def test_empirical_distribution_matches_softmax_at_temperature():
    """4000 first tokens at T=1.5: frequencies match softmax(logits / 1.5) for the top tokens and the tail,
    and many distinct tokens appear: no top-k / top-p truncation, and the temperature really is applied."""
    pol = _policy(5, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    a, b, c = ord("a") + OFFSET, ord("b") + OFFSET, ord("c") + OFFSET
    handle = _bias_logits(pol, {a: 7.5, b: 6.0, c: 4.5})
    try:
        prompt = pol.encode("sample me")
        N, T = 4000, 1.5
        comps = pol.generate([prompt], N, T, 1, torch.Generator().manual_seed(7))[0]
        with torch.no_grad():
            logits = pol.model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    finally:
        handle.remove()
    first = torch.tensor([x.ids[0] for x in comps])
    freq = torch.bincount(first, minlength=VOCAB_SIZE).double() / N
    p = torch.softmax(logits / T, -1)
    p1 = torch.softmax(logits, -1)
    top = torch.argsort(p, descending=True)[:3]
    assert set(top.tolist()) == {a, b, c}
    for t in top.tolist():
        sigma = math.sqrt(p[t] * (1 - p[t]) / N)
        assert abs(freq[t] - p[t]) < 4.5 * sigma, (t, freq[t].item(), p[t].item())
        # and the T=1 distribution would be rejected
    assert abs(freq[a] - p1[a]) > 20 * math.sqrt(p1[a] * (1 - p1[a]) / N)
    tail = torch.ones(VOCAB_SIZE, dtype=torch.bool)
    tail[top] = False
    p_tail, f_tail = p[tail].sum(), freq[tail].sum()
    assert p_tail > 0.3  # the tail is heavy: top-p 0.9 or top-k 3 would remove most of it
    assert abs(f_tail - p_tail) < 4.5 * math.sqrt(p_tail * (1 - p_tail) / N)
    assert int((freq > 0).sum()) > 150  # top-k 50 / 100 would cap this
    # the stored log-prob of each sampled token is log softmax(logits / T)
    lp = torch.tensor([x.logprobs[0] for x in comps], dtype=torch.double)
    assert torch.allclose(lp, torch.log(p[first]), atol=1e-4)


FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def test_decode_caches_sample_what_dynamic_cache_samples(monkeypatch):
    """The model-forward decoder (engine/reference.py): cascade attention (cascade.py: torch's fused CPU kernel,
    and the plain ops it uses elsewhere) and the in-place cache (kv_cache.py) compute what DynamicCache does: same
    tokens, same log-probs, with rows dropping out early and a reservation too small (so it has to regrow). The
    native decoder's own step is held to the same (tests/test_engine.py)."""
    from transformers import DynamicCache

    import atgrpo.engine.reference as reference
    from atgrpo.policies import attention_part
    from atgrpo.policies.kv_cache import ReservedCache

    pol = _policy(2)
    pol.native_decoder = False
    assert pol.cascade  # the tiny policy is a Llama: cascade decoding is on by default
    handle = _bias_logits(pol, {EOS: 3.0})
    ids = [pol.encode(p) for p in PROMPTS]
    runs = {}
    try:
        for name, cascade, factory in [("cascade", True, ReservedCache), ("cascade_plain", True, ReservedCache),
                                       ("reserved", False, ReservedCache),
                                       ("regrowing", False, lambda cap: ReservedCache(4)),
                                       ("dynamic", False, lambda cap: DynamicCache())]:
            monkeypatch.setattr(reference, "ReservedCache", factory)
            monkeypatch.setattr(attention_part, "_FLASH_CPU", None if name == "cascade_plain" else FLASH_CPU)
            pol.cascade = cascade
            comps = pol.generate(ids, 5, 1.0, 25, torch.Generator().manual_seed(7))
            runs[name] = [(c.ids, c.logprobs, c.finished) for row in comps for c in row]
    finally:
        handle.remove()
    assert len({len(ids) for ids, _, _ in runs["dynamic"]}) >= 4  # rows really stopped at different steps
    for name in ("cascade", "cascade_plain", "reserved", "regrowing"):
        assert [i for i, _, _ in runs[name]] == [i for i, _, _ in runs["dynamic"]], name
        assert [f for _, _, f in runs[name]] == [f for _, _, f in runs["dynamic"]], name
        for (_, a, _), (_, b, _) in zip(runs[name], runs["dynamic"]):
            assert a == pytest.approx(b, abs=1e-5), name


def test_cascade_only_on_full_attention_architectures():
    from types import SimpleNamespace as NS

    from atgrpo.policies.cascade import supports

    assert supports(NS(model_type="llama")) and supports(NS(model_type="qwen3", layer_types=["full_attention"] * 2))
    assert not supports(NS(model_type="qwen3", layer_types=["full_attention", "sliding_attention"]))
    assert not supports(NS(model_type="qwen2", use_sliding_window=True))
    assert not supports(NS(model_type="gemma2"))


@pytest.mark.parametrize("arch", ["Llama", "Qwen2", "Qwen3"])
def test_cascade_with_grouped_query_attention(arch):
    """Every architecture cascade decoding is switched on for, with fewer key/value heads than query heads
    (SmolLM2, Qwen3): cascade decoding equals the plain cache."""
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256)
    pol = CausalLMPolicy("p", getattr(transformers, f"{arch}ForCausalLM")(cfg), ByteTokenizer())
    assert pol.cascade
    pol.native_decoder = False  # the model-forward decoder (the native one: tests/test_engine.py)
    ids = [pol.encode(p) for p in PROMPTS]
    out = {}
    for flag in (True, False):
        pol.cascade = flag
        comps = pol.generate(ids, 4, 1.0, 12, torch.Generator().manual_seed(3))
        out[flag] = [(c.ids, c.logprobs) for row in comps for c in row]
    assert [i for i, _ in out[True]] == [i for i, _ in out[False]]
    for (_, a), (_, b) in zip(out[True], out[False]):
        assert a == pytest.approx(b, abs=1e-5)


def test_sample_tokens_draws_each_row_from_its_own_distribution():
    """Inverse-CDF sampling: per-row frequencies match each (unnormalised) row, zero-probability tokens are never
    drawn, and the draw is a function of the generator's seed."""
    from atgrpo.engine.sampling import sample_tokens

    probs = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0],  # sums to 4: 0.5 / 0.25 / 0.25
                          [1e-3, 0.0, 0.0, 0.0, 0.0, 0.999]])
    N = 20000
    draws = torch.stack([sample_tokens(probs, g) for g in [torch.Generator().manual_seed(3)] for _ in range(N)])
    for row in range(2):
        freq = torch.bincount(draws[:, row], minlength=6).double() / N
        p = probs[row].double() / probs[row].sum()
        assert bool((freq[p == 0] == 0).all()), freq
        sigma = (p * (1 - p) / N).sqrt()
        assert bool(((freq - p).abs() <= 4.5 * sigma + 1e-12).all()), (row, freq, p)
    assert 0 < int((draws[:, 1] == 0).sum()) < 60  # the 1e-3 token appears about 20 times in 20000
    again = [sample_tokens(probs, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(again[0], again[1])


def test_sample_tokens_across_blocks_matches_the_distribution_and_never_draws_a_zero():
    """The two-level draw over a vocabulary of several blocks (600 tokens: blocks of 256, the last one padded):
    mass in three blocks, zeros at block edges, a row whose whole mass is one token."""
    from atgrpo.engine.sampling import SAMPLE_BLOCK, sample_tokens

    probs = torch.zeros(2, 600)
    picks = {10: 1.0, 254: 2.0, SAMPLE_BLOCK: 1.0, 2 * SAMPLE_BLOCK - 1: 3.0, 599: 1.0}  # 255, 256+... are zero
    for t, w in picks.items():
        probs[0, t] = w
    probs[1, 300] = 0.7
    g = torch.Generator().manual_seed(11)
    N = 20000
    draws = torch.stack([sample_tokens(probs, g) for _ in range(N)])
    assert set(draws[:, 1].tolist()) == {300}
    freq = torch.bincount(draws[:, 0], minlength=600).double() / N
    assert set(torch.nonzero(freq).squeeze(1).tolist()) == set(picks)
    for t, w in picks.items():
        p = w / sum(picks.values())
        assert abs(freq[t].item() - p) <= 4.5 * (p * (1 - p) / N) ** 0.5, (t, freq[t].item(), p)
