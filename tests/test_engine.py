"""The native engine (atgrpo/engine): its decoding step against the model's own forward, its sampling stream,
and the property CUDA graphs need (no host synchronisation, static shapes) recorded op by op."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from atgrpo.engine import native_generate, reference_generate, why_not
from atgrpo.engine.decoder import Decoder
from atgrpo.engine.sampling import draw_uniforms, next_tokens
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, attention_part, build_tiny_model
from atgrpo.policies.kv_cache import CascadeCache
from atgrpo.policies.tokenizer import EOS, VOCAB_SIZE

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["x", "hello world", "a much longer prompt, with punctuation! and more words"]


def _arch_policy(arch: str, seed: int = 0) -> CausalLMPolicy:
    """A tiny model of ``arch`` with grouped-query heads (as SmolLM2 and Qwen3 have); Qwen2 has q/k/v biases,
    Qwen3 per-head q/k norms."""
    torch.manual_seed(seed)
    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256)
    model = getattr(transformers, f"{arch}ForCausalLM")(cfg)
    if arch == "Qwen2":  # non-zero biases, so that the fused projection must carry them
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    return CausalLMPolicy("p", model, ByteTokenizer())


def _eos_bias(policy, bias: float = 3.0):
    """Raise EOS so rows finish at different steps (a hook on the LM head: both decoders run it)."""
    def hook(mod, inp, out):
        out[..., EOS] += bias
        return out
    return policy.model.get_output_embeddings().register_forward_hook(hook)


def _both(policy, n: int, temperature: float, T: int, seed: int = 7, prompts=PROMPTS, **kw):
    ids = [policy.encode(p) for p in prompts]
    nat = native_generate(policy, policy.decoder(), ids, n, temperature, T, torch.Generator().manual_seed(seed),
                          **kw)
    ref = reference_generate(policy, ids, n, temperature, T, torch.Generator().manual_seed(seed))
    return nat, ref


@pytest.mark.parametrize("arch", ["Llama", "Qwen2", "Qwen3"])
@pytest.mark.parametrize("n,temperature", [(4, 1.0), (1, 1.0), (3, 0.0)])
def test_native_step_samples_what_the_model_forward_samples(arch, n, temperature):
    """float32: the native decoder's tokens equal the model-forward decoder's for the same seed, log-probs within
    rounding, with rows finishing at different steps."""
    pol = _arch_policy(arch)
    assert why_not(pol.model) is None
    handle = _eos_bias(pol)
    try:
        (tok_n, lp_n), (tok_r, lp_r) = _both(pol, n, temperature, 20)
    finally:
        handle.remove()
    lengths = (tok_r >= 0).sum(1)
    if temperature > 0:
        assert len(set(lengths.tolist())) >= 2  # rows really finished at different steps
    assert torch.equal(tok_n, tok_r)
    assert torch.allclose(lp_n, lp_r, atol=1e-5)


def test_native_step_in_plain_ops_samples_what_the_model_forward_samples(monkeypatch):
    """The step as it runs off the CPU (attention in plain matmuls, the path CUDA graphs capture), here on the CPU
    with the fused kernel switched off: the model-forward decoder's tokens."""
    monkeypatch.setattr(attention_part, "_FLASH_CPU", None)
    pol = _arch_policy("Qwen3")
    handle = _eos_bias(pol)
    try:
        (tok_n, lp_n), (tok_r, lp_r) = _both(pol, 3, 1.0, 16)
    finally:
        handle.remove()
    assert torch.equal(tok_n, tok_r) and torch.allclose(lp_n, lp_r, atol=1e-5)


def test_tokens_do_not_depend_on_when_finished_rows_are_dropped():
    """Uniform numbers drawn per (step, row) up front: dropping finished rows every step, every 3 steps or never
    gives the same tokens, and log-probs equal up to the rounding of other batch sizes."""
    pol = CausalLMPolicy("p", build_tiny_model(TINY, 2), ByteTokenizer())
    handle = _eos_bias(pol)
    try:
        ids = [pol.encode(p) for p in PROMPTS]
        runs = [native_generate(pol, pol.decoder(), ids, 5, 1.0, 25, torch.Generator().manual_seed(7),
                                compact_every=every) for every in (1, 3, 1000)]
    finally:
        handle.remove()
    assert len(set((runs[0][0] >= 0).sum(1).tolist())) >= 4
    for tok, lp in runs[1:]:
        assert torch.equal(tok, runs[0][0]) and torch.allclose(lp, runs[0][1], atol=1e-5)


def test_uniforms_drawn_up_front_are_the_per_step_stream():
    """``rand((T, R))`` gives the numbers of T calls of ``rand((R, 1))``: while no row has finished, the engine
    draws what a loop drawing one number per live row at each step draws."""
    g = torch.Generator().manual_seed(1)
    per_step = torch.cat([torch.rand((6, 1), generator=g, dtype=torch.float64) for _ in range(9)], 1).T
    assert torch.equal(draw_uniforms(9, 6, torch.Generator().manual_seed(1), "cpu"), per_step)


def test_policy_generate_uses_the_native_decoder_and_follows_weight_updates():
    """``CausalLMPolicy.generate`` decodes with the native step where it can; the fused weights follow an in-place
    update of the model (the optimizer's way) without being told."""
    pol = CausalLMPolicy("p", build_tiny_model(TINY, 1), ByteTokenizer())
    assert pol.decoder() is not None
    ids = [pol.encode(p) for p in PROMPTS]
    before = pol.generate(ids, 2, 0.0, 12)
    with torch.no_grad():
        for p in pol.model.model.layers[0].mlp.parameters():
            p.add_(torch.randn_like(p))
    after = pol.generate(ids, 2, 0.0, 12)
    pol.native_decoder = False
    ref = pol.generate(ids, 2, 0.0, 12)
    assert [c.ids for r in after for c in r] == [c.ids for r in ref for c in r]
    assert [c.ids for r in after for c in r] != [c.ids for r in before for c in r]


def test_adapters_fall_back_to_the_model_forward():
    peft = pytest.importorskip("peft")
    model = build_tiny_model(TINY, 0)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert "adapters" in why_not(lora)
    assert CausalLMPolicy("p", lora, ByteTokenizer()).decoder() is None


def _state(pol, n: int, T: int):
    """A decoding state after the prefill of PROMPTS, and the first tokens and positions."""
    ids = [pol.encode(p) for p in PROMPTS]
    input_ids, attn = pol.pad_prompts(ids, left=True)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = CascadeCache(attn, T)
    with torch.no_grad():
        pol.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                  **{pol.cache_arg: cache})
    dec: Decoder = pol.decoder()
    st = dec.new_state([la.prompt_k for la in cache.layers], [la.prompt_v for la in cache.layers], attn,
                       len(ids) * n, T)
    st.expand(n)
    tok = torch.randint(3, VOCAB_SIZE, (len(ids) * n,), generator=torch.Generator().manual_seed(0))
    return dec, st, tok, pos[:, -1].repeat_interleave(n) + 1


def test_static_step_equals_the_eager_step():
    """The step CUDA graphs capture (whole own buffer, unwritten positions hidden) computes the eager step's
    logits."""
    pol = _arch_policy("Llama")
    dec, st_e, tok, pos = _state(pol, 3, 8)
    _, st_s, _, _ = _state(pol, 3, 8)
    for step in range(4):
        eager = dec.step(st_e, tok, pos + step)
        static = dec.step(st_s, tok, pos + step, static=True, t=torch.tensor(st_s.t))
        st_s.t += 1
        assert torch.allclose(eager, static, atol=1e-5)
        tok = eager.argmax(-1)


SYNCING = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
           "aten::is_nonzero", "aten::equal", "aten::unique", "aten::_unique2", "aten::allclose"}


class _Record(TorchDispatchMode):
    """Every aten operation run, with the shapes of its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(a.shape) for a in torch.utils._pytree.tree_leaves((args, kwargs))
                       if isinstance(a, torch.Tensor))
        self.ops.append((str(func.overloadpacket.__name__), shapes))
        if func.overloadpacket.__name__ == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in torch.utils._pytree.tree_leaves(args[1:])):
            self.ops.append(("boolean_mask_index", shapes))
        return out


def _record_static_step(dec, st, tok, pos, t: int):
    u = draw_uniforms(1, tok.shape[0], torch.Generator().manual_seed(t), "cpu")[0]
    rec = _Record()
    with rec:
        logits = dec.step(st, tok, pos, static=True, t=torch.tensor(t))
        nxt, _ = next_tokens(logits, 1.0, u)
    return rec.ops, nxt


@pytest.mark.parametrize("arch", ["Llama", "Qwen3"])
def test_decoding_step_has_no_host_synchronisation_and_static_shapes(arch):
    """A static decoding step with its sampling (what a CUDA graph captures) runs no operation that reads a
    tensor's value on the host (``.item()``, ``.tolist()``, ``nonzero``, boolean-mask indexing), and runs the same
    operations on the same shapes at any step with any tokens: nothing in it branches on data or step."""
    pol = _arch_policy(arch)
    dec, st, tok, pos = _state(pol, 2, 10)
    ops_a, nxt = _record_static_step(dec, st, tok, pos, 0)
    ops_b, _ = _record_static_step(dec, st, nxt, pos + 5, 5)
    names = {name for name, _ in ops_a}
    assert not names & {n.removeprefix("aten::") for n in SYNCING}, sorted(names & {n.removeprefix("aten::")
                                                                                    for n in SYNCING})
    assert "boolean_mask_index" not in names
    assert names & {"mm", "addmm", "_linear_pointwise"}  # the recording saw the step's matmuls
    assert ops_a == ops_b


def test_dispatch_recorder_catches_synchronising_ops():
    """The recorder the test above relies on sees ``.item()`` and boolean-mask indexing."""
    x = torch.arange(6.0)
    rec = _Record()
    with rec:
        x.sum().item()
        x[x > 2]
    names = {n for n, _ in rec.ops}
    assert "_local_scalar_dense" in names and "boolean_mask_index" in names


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_graphs_sample_what_eager_steps_sample():
    """On CUDA: replayed graphs give the eager steps' tokens and log-probs (SmolLM2-sized shapes not needed:
    the tiny GQA Llama on the GPU), with rows finishing and dropped between captures."""
    pol = _arch_policy("Llama")
    pol.model.to("cuda")
    pol.device = "cuda"
    handle = _eos_bias(pol)
    ids = [pol.encode(p) for p in PROMPTS]
    out = {}
    try:
        for graphs in (True, False):
            pol.cuda_graphs = graphs
            out[graphs] = native_generate(pol, pol.decoder(), ids, 4, 1.0, 40,
                                          torch.Generator(device="cuda").manual_seed(3), compact_every=4)
    finally:
        handle.remove()
    assert torch.equal(out[True][0], out[False][0])
    assert torch.allclose(out[True][1], out[False][1], atol=1e-5)


def test_decode_state_keep_moves_written_positions():
    """Dropping rows keeps the kept rows' keys/values of the written positions, in order."""
    pol = _arch_policy("Llama")
    dec, st, tok, pos = _state(pol, 2, 6)
    for step in range(3):
        dec.step(st, tok, pos + step)
    before = st.own.clone()
    keep = torch.tensor([0, 3, 5])
    st.keep(keep)
    assert torch.equal(st.own[..., :3, :], before[:, :, keep, :, :3])
    assert st.branches.row_prompt.tolist() == [0, 1, 2]


def test_fused_rms_norm_gives_the_modules_numbers():
    """The decoder's ``F.rms_norm`` for a float32 RMSNorm module computes the module's numbers, bit for bit."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from atgrpo.engine.decoder import _rms_norm

    norm = LlamaRMSNorm(48, eps=1e-5)
    torch.nn.init.normal_(norm.weight, generator=torch.Generator().manual_seed(0))
    x = torch.randn((7, 48), generator=torch.Generator().manual_seed(1)) * 3
    assert torch.equal(_rms_norm(norm, x), norm(x))
