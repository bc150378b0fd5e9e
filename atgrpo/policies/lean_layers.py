"""Decoder layers that keep less for the backward: RMSNorm, SwiGLU and the projections as autograd functions
that save their inputs only.

transformers' RMSNorm (Llama, Qwen2, Qwen3) is a chain of autograd operations that keeps its input and the
normalised input (``2 * hidden`` float32 elements per token per norm, under autocast too); under bfloat16 autocast
each linear that reads the norm's output then keeps its own bfloat16 cast of it (three for the query/key/value
projections, two for gate/up). Its MLP keeps the gate projection (for SiLU), SiLU's output and the up projection
(for the product), and the down projection keeps its input, the product. Per token and layer that is
``14 * hidden + 4 * intermediate`` bytes more than needed under autocast (``tests/test_lean_layers.py`` counts it
in the autograd graph).

Here each norm saves its input and one reciprocal RMS per row and recomputes the normalised input in the
backward; a decoder layer's two norms (the ones whose outputs feed linear layers) hand out a bfloat16 output under
autocast, cast once, so the linears that read it share one copy. SwiGLU (``silu(gate) * up``) saves gate and up
and recomputes SiLU (its gradients bit-identical); with a plain linear down projection SwiGLU and the projection
are one function that recomputes the product for the projection's weight gradient (``SwiGLUDownFunction``:
outputs and gradients bit-identical). The forward computes the same operations as transformers'
modules, so outputs are bit-identical; the norms' gradients are the same functions computed in another order
(float32 rounding apart, ``tests/test_lean_layers.py``). One difference under autocast: the three (two) gradients
that flow back into a shared bfloat16 norm output are summed in bfloat16 by autograd before the norm's backward
casts them to float32, where each used to be cast first and summed in float32: one more bfloat16 rounding in a
backward that runs in bfloat16 anyway.

Under autocast on float32 weights, autograd's linear keeps the bfloat16 copy of its weight that autocast made
(SmolLM2-135M: 152 MiB per micro-batch, whatever its length). The layers' projections run as ``LinearFunction``
instead, which keeps the float32 weight itself (a parameter, no extra memory) and casts it again in the
backward: the same operations in the same dtypes, outputs and gradients bit-identical.

``make_lean(model)`` (run by every ``CausalLMPolicy`` on its model) swaps the forwards of the RMSNorm and MLP
modules of Llama, Qwen2 and Qwen3 and of their decoder layers' plain linears (by class; methods bound to each module, so a ``copy.deepcopy`` keeps them) when
the MLP's activation is SiLU; other models are left as they are. It switches transformers' hub kernels off on the
models it changes (``use_kernels``), because their re-kernelization at each ``train()`` would drop these forwards. ``restore(model)`` undoes it (for side-by-side
measurements: ``benchmarks/lean_layers_ab.py``, ``benchmarks/kept_bytes.py --stock``). The rollout engine reads
the same weights through its own decoder (``engine/decoder.py``) and is untouched."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP")


class RMSNormFunction(torch.autograd.Function):
    """``weight * (x / rms(x))`` as transformers computes it (the normalisation in float32, cast back to ``x``'s
    dtype before the weight), optionally cast to ``out_dtype``; saves ``x`` and the float32 reciprocal RMS."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 (float64 stays: gradcheck)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = weight * (xf * rstd).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y if out_dtype is None else y.to(out_dtype)

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        gw = None
        if ctx.needs_input_grad[1]:
            gw = (gy.to(rstd.dtype) * xhat.to(x.dtype)).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        gx = None
        if ctx.needs_input_grad[0]:
            g = gy.to(rstd.dtype) * weight.to(rstd.dtype)  # the gradient of the normalised input
            gx = (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return gx, gw, None, None


class SwiGLUFunction(torch.autograd.Function):
    """``silu(gate) * up``; saves gate and up and recomputes SiLU in the backward. The backward runs the operations
    autograd runs for the plain expression (``silu_backward`` on ``g * up``), in the inputs' dtype: the same
    gradients, bit for bit."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        gate, up = ctx.saved_tensors
        g_up = g * F.silu(gate) if ctx.needs_input_grad[1] else None
        g_gate = torch.ops.aten.silu_backward(g * up, gate) if ctx.needs_input_grad[0] else None
        return g_gate, g_up


class SwiGLUDownFunction(torch.autograd.Function):
    """``down(silu(gate) * up)`` for a plain linear ``down`` (weight, bias) computing in ``dtype`` (autocast's, as
    autocast runs the linear, or the weight's): saves gate and up only. The down projection's weight gradient needs
    its input ``silu(gate) * up``, which a plain linear keeps (``intermediate`` elements per token); here it is
    recomputed in the backward, which computes SiLU anyway. The operations are those autograd runs for SwiGLU then
    ``F.linear`` on the cast weight: the same outputs and gradients."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                dtype: torch.dtype):
        ctx.save_for_backward(gate, up, weight, bias)
        ctx.dtype = dtype
        with torch.autocast(gate.device.type, enabled=False):
            return F.linear((F.silu(gate) * up).to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        gate, up, weight, bias = ctx.saved_tensors
        with torch.autocast(gate.device.type, enabled=False):
            s = F.silu(gate)
            ga, gw, gb = _linear_grads(gy, (s * up).to(ctx.dtype), weight, bias, True, *ctx.needs_input_grad[2:4])
            ga = ga.to(up.dtype)
            g_up = ga * s if ctx.needs_input_grad[1] else None
            g_gate = torch.ops.aten.silu_backward(ga * up, gate) if ctx.needs_input_grad[0] else None
        return g_gate, g_up, gw, gb, None


class LinearFunction(torch.autograd.Function):
    """``F.linear`` as autocast runs it, computing in ``dtype``: input, weight and bias cast to ``dtype``. Keeps
    the input's cast and the weight itself, not the weight's cast: autograd's linear keeps the ``dtype`` copy of
    the weight that autocast made, a second copy of every float32 master weight alive from the forward to the
    backward; here the backward casts the weight again. The same operations otherwise: outputs and gradients
    bit-identical."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        with torch.autocast(x.device.type, enabled=False):
            xl = x.to(dtype)
            y = F.linear(xl, weight.to(dtype), None if bias is None else bias.to(dtype))
        ctx.save_for_backward(xl, weight, bias)
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        xl, weight, bias = ctx.saved_tensors
        with torch.autocast(gy.device.type, enabled=False):
            gx, gw, gb = _linear_grads(gy, xl, weight, bias, *ctx.needs_input_grad[:3])
        return None if gx is None else gx.to(ctx.x_dtype), gw, gb, None


def _linear_grads(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  need_x: bool, need_w: bool, need_b: bool):
    """The gradients of ``F.linear(x, weight.to(x.dtype), bias)`` given the output's ``gy``, as autograd computes
    them: the input's in ``x``'s dtype (the weight cast again), the weight's and the bias's in their own dtypes;
    None where not needed. Run with autocast off."""
    gx = gy.matmul(weight.to(x.dtype)) if need_x else None
    flat_gy = gy.reshape(-1, gy.shape[-1])
    gw = flat_gy.t().mm(x.reshape(-1, x.shape[-1])).to(weight.dtype) if need_w else None
    gb = flat_gy.sum(0).to(bias.dtype) if bias is not None and need_b else None
    return gx, gw, gb


def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Float32 weights under autocast: ``LinearFunction``; otherwise (no autocast, the rollout copy's bfloat16
    weights) the plain linear."""
    if self.weight.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type):
        return LinearFunction.apply(x, self.weight, self.bias, torch.get_autocast_dtype(x.device.type))
    return F.linear(x, self.weight, self.bias)


def _norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    out = None
    if self.atgrpo_cast_output and torch.is_autocast_enabled(x.device.type):
        out = torch.get_autocast_dtype(x.device.type)
    return RMSNormFunction.apply(x, self.weight, self.variance_epsilon, out)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    gate, up, down = self.gate_proj(x), self.up_proj(x), self.down_proj
    if type(down) is torch.nn.Linear and not down._forward_hooks and not down._forward_pre_hooks:
        auto = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if auto else down.weight.dtype
        return SwiGLUDownFunction.apply(gate, up, down.weight, down.bias, dtype)
    return down(SwiGLUFunction.apply(gate, up))  # a wrapped down projection (LoRA's): it runs itself


def supports(config) -> bool:
    """Whether ``make_lean`` may change a model of this config: its MLP's activation is SiLU (which modules change
    is decided by their classes)."""
    return getattr(config, "hidden_act", None) == "silu"


def make_lean(model: torch.nn.Module) -> int:
    """Swap the forwards of ``model``'s RMSNorm and MLP modules for the lean ones (above); returns how many
    modules changed (0 for an unsupported model). Idempotent; under peft pass the base model."""
    if not supports(getattr(model, "config", None)):
        return 0
    if getattr(model, "use_kernels", False):
        # transformers (5.x, with the ``kernels`` package) loads models with hub kernels on and kernelizes them
        # again at every ``train()`` / ``eval()`` switch, which drops the forwards set here: the warm start and the
        # update (``train()``) then ran the stock norms and MLPs. Switched off, the model keeps torch's
        # implementations, which the lean forwards replace.
        model.use_kernels = False
    changed = 0
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in NORM_CLASSES:
            # the norms in front of linear layers: a decoder layer's two; not the final norm (the LM head runs in
            # its weights' dtype) nor Qwen3's per-head query/key norms (their outputs are rotated, then attended)
            module.atgrpo_cast_output = name.rsplit(".", 1)[-1] in ("input_layernorm", "post_attention_layernorm")
            module.forward = types.MethodType(_norm_forward, module)
            changed += 1
        elif kind in MLP_CLASSES:
            module.forward = types.MethodType(_mlp_forward, module)
            changed += 1
        elif type(module) is torch.nn.Linear and ".layers." in f".{name}":
            # a decoder layer's projections (not the LM head, which runs in its weights' dtype): under autocast
            # they keep their float32 weights, not casts of them (``LinearFunction``)
            module.forward = types.MethodType(_linear_forward, module)
            changed += 1
    return changed


def restore(model: torch.nn.Module) -> None:
    """Undo ``make_lean``: the classes' own forwards run again."""
    lean = (_norm_forward, _mlp_forward, _linear_forward)
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), "__func__", None) in lean:
            del module.forward
