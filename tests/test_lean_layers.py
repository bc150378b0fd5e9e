"""The lean RMSNorm and SwiGLU (atgrpo/policies/lean_layers.py) against transformers' own modules.

The forward is bit-identical (float32, bfloat16 weights, bfloat16 autocast on float32 weights); parameter and
input gradients agree within float32 rounding (and within bfloat16 rounding under autocast); the backward keeps
what the docstring says: per token and layer, each norm's input and one reciprocal RMS, one bfloat16 norm output
under autocast, SwiGLU's two inputs (not the down projection's input), counted from the autograd graph."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from atgrpo.policies.lean_layers import (LinearFunction, RMSNormFunction, SwiGLUDownFunction, SwiGLUFunction,
                                         make_lean, restore)
from atgrpo.policies.precision import apply_autocast
from atgrpo.trainer.memory import saved_tensor_bytes

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")


def _model(kind: str, dtype=torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**SIZES, head_dim=16)).to(dtype)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).to(dtype)


def _run(model, ids):
    model.zero_grad(set_to_none=True)
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeds).logits
    (logits.float().square().mean() + logits.float()[..., 3].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), embeds.grad.clone(), grads


def _pair(kind: str, dtype=torch.float32, autocast: bool = False):
    stock = _model(kind, dtype)
    lean = copy.deepcopy(stock)
    # norms, final norm, MLPs, q/k norms, the layers' linears (q, k, v, o, gate, up, down)
    assert make_lean(lean) == 2 * 2 + 1 + 2 + (4 if kind == "qwen3" else 0) + 2 * 7
    if autocast:
        stock, lean = apply_autocast(stock, "bfloat16"), apply_autocast(lean, "bfloat16")
    return stock, lean


IDS = torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_float32_forward_is_identical_and_gradients_agree(kind):
    stock, lean = _pair(kind)
    ls, es, gs = _run(stock, IDS)
    ll, el, gl = _run(lean, IDS)
    assert torch.equal(ls, ll)
    torch.testing.assert_close(el, es, rtol=1e-4, atol=1e-5)
    assert gs.keys() == gl.keys()
    for n in gs:
        torch.testing.assert_close(gl[n], gs[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_bfloat16_autocast_forward_is_identical_and_gradients_within_rounding(kind):
    stock, lean = _pair(kind, autocast=True)
    ls, es, gs = _run(stock, IDS)
    ll, el, gl = _run(lean, IDS)
    assert torch.equal(ls, ll)
    for n in gs:  # a few bfloat16 roundings apart: relative to the gradient's own size
        err = (gl[n] - gs[n]).norm() / gs[n].norm().clamp_min(1e-12)
        assert err < 2e-2, (n, float(err))


def test_bfloat16_weights_forward_is_identical():
    stock, lean = _pair("qwen3", dtype=torch.bfloat16)
    assert torch.equal(_run(stock, IDS)[0], _run(lean, IDS)[0])


def test_functions_match_autograd_of_the_plain_expressions():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, 24, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-6, None), (x, w))
    gate = torch.randn(4, 9, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 9, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(SwiGLUFunction.apply, (gate, up))
    w = torch.randn(6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda *a: SwiGLUDownFunction.apply(*a, torch.float64), (gate, up, w, b))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_linear_is_autocast_linear_bit_for_bit(bias, x_dtype):
    """``LinearFunction`` against ``nn.Linear`` under bfloat16 autocast: the output and the gradients of the input,
    the weight and the bias equal, bit for bit; its graph keeps no bfloat16 copy of the weight."""
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(3, 7, 40, generator=g).to(x_dtype)
    lin = torch.nn.Linear(40, 24, bias=bias)
    results = []
    for lean in (False, True):
        lin.zero_grad()
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = LinearFunction.apply(x, lin.weight, lin.bias, torch.bfloat16) if lean else lin(x)
        if lean:
            kept = saved_tensor_bytes(y.float().sum())
            cast = x0.numel() * 2 if x_dtype == torch.float32 else 0  # a bfloat16 input is kept as it is (a leaf)
            assert sum(kept.values()) == cast, kept  # the input's bfloat16 cast only
        (y.float() ** 2).sum().backward()
        results.append((y.detach(), x.grad, lin.weight.grad.clone(), None if lin.bias is None else lin.bias.grad))
    assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(*results))


def test_restore_undoes_every_lean_forward():
    stock, lean = _pair("qwen3")
    restore(lean)
    assert not any("forward" in m.__dict__ for m in lean.modules())


@pytest.mark.parametrize("autocast", [False, True])
def test_swiglu_down_is_swiglu_then_the_linear_bit_for_bit(autocast):
    """The fused down projection against SwiGLU then nn.Linear (under bfloat16 autocast: the linear in bfloat16):
    outputs and every gradient equal, bit for bit."""
    g = torch.Generator().manual_seed(4)
    gate, up = torch.randn(3, 5, 40, generator=g), torch.randn(3, 5, 40, generator=g)
    lin = torch.nn.Linear(40, 24)
    results = []
    for fused in (False, True):
        lin.zero_grad()
        gt, ut = gate.clone().requires_grad_(), up.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            gg, uu = (gt.to(torch.bfloat16), ut.to(torch.bfloat16)) if autocast else (gt, ut)
            if fused:
                y = SwiGLUDownFunction.apply(gg, uu, lin.weight, lin.bias, torch.bfloat16 if autocast else torch.float32)
            else:
                y = lin(SwiGLUFunction.apply(gg, uu))
        (y.float() ** 2).sum().backward()
        results.append((y.detach(), gt.grad, ut.grad, lin.weight.grad.clone(), lin.bias.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_the_backward_keeps_what_the_docstring_says():
    """Per token and layer: each norm's float32 input and reciprocal RMS and its one bfloat16 output, SwiGLU's
    gate and up, where the stock modules keep each norm's input, normalised input and reciprocal RMS, a bfloat16
    cast per linear that reads it (five), SwiGLU's gate, SiLU output and up, and the down projection's input:
    ``14 * hidden + 4 * intermediate`` bytes less per token and layer, and ``4 * hidden`` less per token at the
    final norm (no cast there); and no bfloat16 copy of a layer's weights (cast again in the backward)."""
    cfg = dict(SIZES, hidden_size=128, intermediate_size=384, num_hidden_layers=2)
    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(**cfg))
    lean = copy.deepcopy(stock)
    make_lean(lean)
    stock, lean = apply_autocast(stock, "bfloat16"), apply_autocast(lean, "bfloat16")
    ids = torch.randint(0, 96, (1, 512))
    kept = {}
    for name, m in (("stock", stock), ("lean", lean)):
        kept[name] = sum(saved_tensor_bytes(m(input_ids=ids).logits.sum()).values())
    h, i, layers, tokens = 128, 384, 2, 512
    weights = sum(p.numel() for n, p in stock.named_parameters() if n.endswith("proj.weight"))
    saved = layers * tokens * (14 * h + 4 * i) + tokens * 4 * h + weights * 2  # + the weights' bfloat16 casts
    assert kept["stock"] - kept["lean"] == saved, kept


def test_lean_forwards_survive_train_mode_of_a_model_loaded_with_hub_kernels(tmp_path):
    """transformers loads a saved model with ``use_kernels`` on (when the ``kernels`` package is installed) and
    kernelizes it again at ``train()``, which used to drop the lean forwards: the warm start and the update ran
    the stock modules. After ``make_lean`` a loaded model in train mode runs the lean norm."""
    pytest.importorskip("kernels")
    _model("llama").save_pretrained(tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    make_lean(model)
    assert not model.use_kernels
    calls = []
    model.model.norm.register_forward_hook(lambda mod, args, out: calls.append(mod.forward.__func__.__name__))
    for mode in (True, False, True):
        model.train(mode)
        model(input_ids=IDS)
    assert calls == ["_norm_forward"] * 3
