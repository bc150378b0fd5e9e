"""Per-role LoRA (sharing level L2): one frozen base model, one LoRA adapter per role, through ``peft``.

Every role gets its own ``CausalLMPolicy`` whose ``model`` is an ``AdapterView`` of the one ``PeftModel``:

- its ``forward`` activates the role's adapter before *every* call, so everything that runs the model for that
  role (generation, ``response_logprobs``, shared-prefix scoring, the warm start, a direct ``policy.model(...)``)
  uses that adapter whatever another role ran last: no caller has to remember to switch;
- its ``parameters()`` and ``state_dict()`` are that adapter's alone, so the role's optimizer, gradient clipping
  and checkpoints hold only its adapter: a role's samples can only update its own adapter (docs/method.md,
  pitfall 9); the base weights are frozen (``requires_grad=False``).

Roles share one model and switch adapters, so two roles must not run a forward at the same time (no threads).
``save_pretrained`` writes the adapter in peft's format (``PeftModel.from_pretrained(base, dir)`` loads it) and,
for a base that exists nowhere else (the tiny model), the base model in ``dir/base_model``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Iterator

import torch
from torch import nn

BASE_SUBDIR = "base_model"


def _require_peft():
    try:
        import peft
    except ImportError as e:
        raise ImportError("policy.sharing=L2 (per-role LoRA) needs the `peft` package: pip install peft "
                          "(or pip install -e '.[lora]')") from e
    return peft


def lora_peft_config(lcfg):
    """peft's ``LoraConfig`` from ``policy.lora`` (rank, alpha, target modules, dropout)."""
    peft = _require_peft()
    targets = lcfg.target_modules if isinstance(lcfg.target_modules, str) else list(lcfg.target_modules)
    return peft.LoraConfig(r=int(lcfg.rank), lora_alpha=lcfg.alpha, target_modules=targets,
                           lora_dropout=float(lcfg.dropout), bias="none", task_type="CAUSAL_LM")


def attach_adapters(base: nn.Module, names: list[str], lcfg, seed: int):
    """Wrap ``base`` in a ``PeftModel`` with one fresh adapter per name (base weights frozen); deterministic
    for a seed (LoRA A matrices are random, B matrices zero, so every adapter starts as the base model)."""
    peft = _require_peft()
    if not names:
        raise ValueError("attach_adapters needs at least one adapter name")
    conf = lora_peft_config(lcfg)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        model = peft.get_peft_model(base, conf, adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, conf)
    _fix_requires_grad(model, names)
    return model


def _fix_requires_grad(model, names) -> None:
    """Every adapter trainable, the base frozen. (peft's ``set_adapter`` freezes the inactive adapters; an
    inactive adapter takes no part in the forward, so it gets no gradient either way, and keeping it trainable
    lets code that collects ``requires_grad`` parameters, like the optimizer factory, see every adapter.)"""
    for n, p in model.named_parameters():
        p.requires_grad_(any(is_adapter_param(n, a) for a in names))


def is_adapter_param(name: str, adapter: str) -> bool:
    """Whether a parameter name of the PeftModel belongs to ``adapter`` (``...lora_A.<adapter>.weight``)."""
    parts = name.split(".")
    return any(a.startswith("lora_") and b == adapter for a, b in zip(parts, parts[1:]))


class AdapterView(nn.Module):
    """One role's view of a shared ``PeftModel``: that role's adapter, active on every forward.

    The ``PeftModel`` is held as a plain attribute, not a submodule, so ``parameters()`` and ``state_dict()``
    see only this adapter. Other attributes (``config``, ``get_output_embeddings`` ...) come from the
    ``PeftModel``."""

    def __init__(self, peft_model, adapter: str, save_base: bool = False):
        super().__init__()
        if adapter not in peft_model.peft_config:
            raise ValueError(f"no adapter {adapter!r} in the model; adapters: {sorted(peft_model.peft_config)}")
        object.__setattr__(self, "peft", peft_model)
        self.adapter = adapter
        self.save_base = save_base  # also write the base model (it exists nowhere else: the tiny model)
        self.training = peft_model.training

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            peft_model = self.__dict__.get("peft")
            if peft_model is None:
                raise
            return getattr(peft_model, name)

    # ---- the adapter is active on every call --------------------------------------------------------
    def activate(self) -> None:
        if list(self.peft.active_adapters) != [self.adapter]:
            self.peft.set_adapter(self.adapter)
            _fix_requires_grad(self.peft, list(self.peft.peft_config))

    def forward(self, *args, **kwargs):
        self.activate()
        return self.peft(*args, **kwargs)

    def generate(self, *args, **kwargs):
        self.activate()
        return self.peft.generate(*args, **kwargs)

    def get_base_model(self):
        return self.peft.get_base_model()

    # ---- only this adapter's parameters ---------------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, nn.Parameter]]:
        for n, p in self.peft.named_parameters(prefix=prefix, remove_duplicate=remove_duplicate):
            if is_adapter_param(n, self.adapter):
                yield n, p

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        for _, p in self.named_parameters():
            yield p

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The adapter's weights under peft's saved names (those of ``adapter_model.safetensors``)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.peft, adapter_name=self.adapter)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load adapter weights (peft's saved names) in place: the optimizer's tensors stay the same."""
        from peft import set_peft_model_state_dict

        own = set(self.state_dict())
        unknown, missing = sorted(set(state_dict) - own), sorted(own - set(state_dict))
        if unknown or (strict and missing):
            raise RuntimeError(f"adapter {self.adapter!r}: unexpected keys {unknown[:5]}, missing keys {missing[:5]}")
        with torch.no_grad():
            set_peft_model_state_dict(self.peft, dict(state_dict), adapter_name=self.adapter)
        return nn.modules.module._IncompatibleKeys(missing, unknown)

    # ---- mode, device, dtype: the shared model ---------------------------------------------------------
    def train(self, mode: bool = True) -> "AdapterView":
        self.training = mode
        self.peft.train(mode)
        return self

    def _apply(self, fn, recurse: bool = True):
        self.peft._apply(fn)
        return self

    # ---- checkpoints in peft's format ------------------------------------------------------------------
    def save_pretrained(self, save_directory: str, **kwargs) -> None:
        """``adapter_config.json`` + ``adapter_model.safetensors`` in ``save_directory`` (plus the base model in
        ``save_directory/base_model`` when ``save_base``)."""
        os.makedirs(save_directory, exist_ok=True)
        self.peft.save_pretrained(save_directory, selected_adapters=[self.adapter], **kwargs)
        sub = os.path.join(save_directory, self.adapter)  # peft writes a non-"default" adapter one level down
        if self.adapter != "default" and os.path.isdir(sub):
            for f in os.listdir(sub):
                os.replace(os.path.join(sub, f), os.path.join(save_directory, f))
            shutil.rmtree(sub)
        if self.save_base:
            self._save_base(os.path.join(save_directory, BASE_SUBDIR))

    def _save_base(self, path: str) -> None:
        """The base model without any adapter (the LoRA layers' ``base_layer`` weights), loadable with
        ``AutoModelForCausalLM.from_pretrained``."""
        base = self.peft.get_base_model()
        sd = {}
        for k, v in base.state_dict().items():
            if "lora_" in k:
                continue
            sd[k.replace(".base_layer.", ".")] = v
        clean = type(base)(base.config)
        res = clean.load_state_dict(sd, strict=False)
        tied = {"lm_head.weight"} if getattr(base.config, "tie_word_embeddings", False) else set()
        if res.unexpected_keys or set(res.missing_keys) - tied:
            raise RuntimeError(f"saving the base model: unexpected {res.unexpected_keys[:5]}, "
                               f"missing {sorted(set(res.missing_keys) - tied)[:5]}")
        clean.tie_weights()
        clean.to(next(base.parameters()).dtype).save_pretrained(path)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
