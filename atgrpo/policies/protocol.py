"""What the rest of atgrpo calls on a policy: ``Policy`` (sampling: the rollout and evaluation) and
``TrainablePolicy`` (that, plus what the update, the warm start and shared-prefix scoring use).

Implementations: ``causal_lm.CausalLMPolicy`` and ``hf.HFPolicy`` are trainable; the Ray driver's
``trainer.ray.workers.RemotePolicy`` and vLLM's ``engine.vllm_engine.EnginePolicy`` are sampling views of a
trainable policy; the tests' scripted policies are sampling policies (tests/test_protocols.py checks them all).
Both protocols are ``runtime_checkable``: ``isinstance`` checks that the members exist, not their signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # annotations only: environment workers import the rollout without torch
    import torch

    from .causal_lm import Completion


@runtime_checkable
class Policy(Protocol):
    """A policy as the rollout (``rollout/tree.py``) and the evaluation see it: text in, sampled text out."""

    policy_id: str  # the policy's name; ``Sample.policy`` of every sample it generates

    def render(self, prompt: str | list[dict[str, str]]) -> str:
        """The prompt text: a compact (string) prompt as it is; chat messages rendered with the generation prompt
        (the assistant's turn opened). Deterministic: the K candidates of a node share the one rendered text."""
        ...

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids as ``generate`` and the loss take them (the same ids for the same text).
        Raises ``ValueError`` when the prompt is longer than the policy allows."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of response ids, special tokens dropped (``Completion.text`` is ``decode(Completion.ids)``;
        ``rollout.per_agent.<role>.stop`` cuts responses with it)."""
        ...

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        """``n`` completions of each prompt: ``result[i][k]`` is branch k of prompt i (i.i.d. samples given the
        prompt). Each completion holds at most ``max_new_tokens`` ids, EOS included when it was produced
        (``finished``), and, when ``temperature > 0``, one log-prob per id: ``log softmax(logits / T)[id]``, the
        distribution the loss scores (``TrainablePolicy.response_logprobs``), so the importance ratio starts at 1.
        ``temperature == 0``: greedy, no log-probs. All randomness comes from ``generator`` (None: torch's global
        generator), so a run with the same generator state samples the same tokens."""
        ...


@runtime_checkable
class TrainablePolicy(Policy, Protocol):
    """A policy the update trains (``trainer/update.py``), the warm start fine-tunes (``trainer/warmstart.py``) and
    ``policies/shared_prefix.py`` scores: a transformers causal LM and what is needed to run it."""

    model: Any  # the torch module (``parameters()``, ``train()``, ``eval()``, a transformers forward)
    device: str  # where ``model`` lives; the tensors these calls return are there
    eos_id: int  # ends a response (``encode_response`` appends it; ``generate`` stops on it)
    pad_id: int  # fills padded positions (never attended)
    cascade: bool  # shared-prefix scoring may run one packed prefix tree (``cascade.PrefixTree``) on ``model``
    cache_arg: str  # the name of ``model``'s KV-cache argument (``cache`` or ``past_key_values``)
    takes_logits_to_keep: bool  # ``model``'s forward takes ``logits_to_keep`` (logits of chosen positions only)

    def encode_response(self, text: str) -> list[int]:
        """A response's ids as ``generate`` emits them after a prompt: the text's tokens, no special token added,
        then EOS (warm-start demonstrations are tokenised this way)."""
        ...

    def pad_prompts(self, prompts: Sequence[Sequence[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids, mask  # (B, Lp)`` on ``device``: the prompts padded with ``pad_id`` on the left or the right."""
        ...

    def response_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]],
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``logp, mask  # (B, T)``: ``log softmax(logits / T)`` of each response token given its prompt and the
        tokens before it, with gradients, rows right-padded (mask 0) to the longest response; the same
        distribution ``generate`` samples from."""
        ...
