"""The built-in tiny policy: a small Llama-architecture transformers model with the byte-level tokenizer.

It trains at thousands of tokens per second on two CPU cores, so AT-GRPO can run end to end on a laptop. It
knows nothing at first; the trainer gives it a short supervised warm start on scripted demonstrations.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..config import TinyConfig as TinyModelConfig  # the one definition lives in the config tree
from .tokenizer import BOS, EOS, PAD, VOCAB_SIZE


def build_tiny_model(cfg: TinyModelConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama (deterministic for a seed)."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True, pad_token_id=PAD,
        bos_token_id=BOS, eos_token_id=EOS, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model
