"""Mixed precision: bfloat16 compute on float32 master weights (``model.autocast: bfloat16``).

Full fine-tuning in bfloat16 weights loses small updates: with lr 1e-6 an AdamW step changes a weight by about
1e-6 of its size, below bfloat16's resolution (2^-8), so it rounds away. The usual cure, and the one here: keep
the weights, their gradients and the AdamW states in float32 (``model.dtype: float32``) and run the forward
(and so the backward) of the transformer in bfloat16 under ``torch.autocast``. Matmuls and attention run in
bfloat16; normalisations, softmax and the loss stay in float32; the optimizer updates float32 weights.

One exception, on purpose: the output layer (LM head) runs in its weights' dtype with autocast off. Its logits
feed every log-prob of the loss and of sampling; bfloat16 logits of size ~20 are rounded to steps of 0.125,
which would move each token's log-prob (and so the importance ratio) by up to that much. With float32 master
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

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16}


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
