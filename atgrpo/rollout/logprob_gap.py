"""Samples drawn elsewhere, and how far the sampler's log-probs were from the trainer's.

A rollout engine that holds its own copy of a policy (vLLM, or the bfloat16 copy of ``policies/rollout_copy.py``)
samples from a slightly different distribution than the trainer scores: other kernels, another precision. The
loss must start from the trainer's own log-probs (the importance ratio is 1 before the first optimizer step).
So a view that samples elsewhere (``RescoredView``) marks what it returns (``Completion.trainer_logprobs =
False``), and the update puts the trainer's log-probs in their place before its first optimizer step
(``trainer.update.take_trainer_logprobs``): the first mini-batch's own forward gives them for free, the later
mini-batches get one no-grad pass. The sampler's log-probs only measure the difference: ``LogprobGap`` keeps
mean and max ``|sampler - trainer|`` per policy, logged as ``rollout/logprob_gap/<policy>/{mean,max}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..policies.causal_lm import Completion
from ..policies.protocol import TrainablePolicy


@dataclass
class LogprobGap:
    """``|sampler log-prob - trainer log-prob|`` over sampled tokens, per policy, since the last ``pop``."""

    total: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)

    def add(self, pid: str, diffs: torch.Tensor) -> None:
        if diffs.numel():
            self.total[pid] = self.total.get(pid, 0.0) + float(diffs.sum())
            self.count[pid] = self.count.get(pid, 0) + diffs.numel()
            self.worst[pid] = max(self.worst.get(pid, 0.0), float(diffs.max()))

    def pop(self) -> dict[str, float]:
        out = {}
        for pid in self.count:
            out[f"rollout/logprob_gap/{pid}/mean"] = self.total[pid] / self.count[pid]
            out[f"rollout/logprob_gap/{pid}/max"] = self.worst[pid]
        self.total, self.count, self.worst = {}, {}, {}
        return out


class RescoredView:
    """The base of a rollout view that samples elsewhere (a ``protocol.Policy``): prompts are rendered, encoded and
    decoded by the trainer's ``policy`` (its other attributes too: tokenizer, eos_id ...), and ``mark_owed`` marks
    what was sampled as owed the trainer's log-probs. Subclasses define ``generate``."""

    def __init__(self, policy: TrainablePolicy):
        self.policy = policy
        self.policy_id = policy.policy_id

    def __getattr__(self, name: str):
        return getattr(self.__dict__["policy"], name)

    def render(self, prompt) -> str:
        return self.policy.render(prompt)

    def encode(self, text: str) -> list[int]:
        return self.policy.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.policy.decode(ids)

    @staticmethod
    def mark_owed(comps: list[list[Completion]], temperature: float) -> list[list[Completion]]:
        """``comps``, sampled ones (``temperature > 0``; greedy has no log-probs) marked as owed the trainer's
        log-probs, which the update takes (``trainer.update.take_trainer_logprobs``)."""
        if temperature > 0:
            for row in comps:
                for c in row:
                    c.trainer_logprobs = False
        return comps
