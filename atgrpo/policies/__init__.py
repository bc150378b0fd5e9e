"""Policies: the trainable models behind the agents (never imports envs)."""

from .causal_lm import CausalLMPolicy, Completion
from .protocol import Policy, TrainablePolicy
from .tiny import TinyModelConfig, build_tiny_model
from .tokenizer import ByteTokenizer

__all__ = ["CausalLMPolicy", "Completion", "Policy", "TrainablePolicy", "TinyModelConfig", "build_tiny_model",
           "ByteTokenizer"]
