"""Mixed precision: bfloat16 compute on float32 master weights (``model.precision``, ``model.autocast``).

``model.precision: auto | float32 | bfloat16`` chooses for the whole run (``resolve_precision``): with
``bfloat16`` the update and the warm start run under autocast (below) on float32 master weights, and rollouts
sample from a bfloat16 copy of each policy (``rollout_copy.py``). ``auto`` picks bfloat16 for Hugging Face models
on a CPU that computes bfloat16 natively (AMX or AVX512-BF16: ``bf16_units``) and float32 everywhere else: a CPU
without those units emulates bfloat16 matmuls, many times slower than float32. The tiny model stays float32.

Full fine-tuning in bfloat16 weights loses small updates: with lr 1e-6 an AdamW step changes a weight by about
1e-6 of its size, below bfloat16's resolution (2^-8), so it rounds away. The usual cure, and the one here: keep
the weights, their gradients and the AdamW states in float32 (``model.dtype: float32``) and run the forward
(and so the backward) of the transformer in bfloat16 under ``torch.autocast``. Matmuls and attention run in
bfloat16; normalisations, softmax and the loss stay in float32; the optimizer updates float32 weights.

One exception, on purpose: the output layer (LM head) runs in its weights' dtype with autocast off. Its logits
feed every log-prob of the loss; bfloat16 logits of size ~20 are rounded to steps of 0.125, which would move
each token's log-prob (and so the importance ratio) by up to that much. (The rollout copy samples from a head
that ranks in bfloat16 and recomputes each row's highest logits in float32: ``rollout_copy.py``.) With float32 master
weights the head is a float32 matmul; with bfloat16 weights (``model.dtype: bfloat16``, e.g. L2's frozen base)
it stays the bfloat16 matmul it was.

Applied once to a freshly built model (``apply_autocast``), before LoRA adapters are attached: every forward
that runs the model afterwards (sampling, scoring, shared-prefix scoring, the warm start, peft's wrapper) runs
under it. Like ``accelerate``'s mixed precision, it wraps the model instance's ``forward``; the model's class,
weights and ``save_pretrained`` are untouched.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from .. import hardware  # the choice of precision, without torch (``atgrpo plan-memory`` imports no torch)

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16}
BF16_UNITS, ARM_BF16 = hardware.BF16_UNITS, hardware.ARM_BF16
cpu_flags, bf16_units, resolve_precision = hardware.cpu_flags, hardware.bf16_units, hardware.resolve_precision


def autocast_of(mcfg, backend: str = "local") -> str:
    """The ``apply_autocast`` setting of a model built for ``mcfg``: ``bfloat16`` when its precision resolves to
    bfloat16 on float32 weights, else ``none``."""
    if mcfg.dtype != "float32":
        return "none"
    return "bfloat16" if resolve_precision(mcfg, backend)[0] == "bfloat16" else "none"


def _device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


def apply_autocast(model: torch.nn.Module, autocast: str) -> torch.nn.Module:
    """Run ``model``'s forward under ``torch.autocast`` in ``autocast`` ("none": leave it as it is), its output
    layer in its weights' dtype. Call after the model is on its device. Returns the same model.

    The wrappers are methods bound to the model (and the head), so ``copy.deepcopy`` (the KL reference policy)
    rebinds them to the copy instead of running the original's weights."""
    if autocast == "none":
        return model
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"model.autocast={autocast!r}: expected none or one of {sorted(AUTOCAST_DTYPES)}")
    if getattr(model, "atgrpo_autocast", None) is not None:
        raise ValueError("apply_autocast: this model already runs under autocast")
    model.atgrpo_autocast = (_device_type(model), AUTOCAST_DTYPES[autocast])
    model.forward = types.MethodType(_autocast_forward, model)
    head = model.get_output_embeddings()
    if head is not None:
        head.atgrpo_device_type = model.atgrpo_autocast[0]
        head.forward = types.MethodType(_exact_head_forward, head)
    return model


def _autocast_forward(self, *args, **kwargs):
    device_type, dtype = self.atgrpo_autocast
    with torch.autocast(device_type=device_type, dtype=dtype):
        return type(self).forward(self, *args, **kwargs)


def _exact_head_forward(self, x: torch.Tensor) -> torch.Tensor:
    """The LM head with autocast off: its input cast to the weights' dtype, one matmul in that dtype."""
    with torch.autocast(device_type=self.atgrpo_device_type, enabled=False):
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)
