"""The trainer's log-probs for samples drawn elsewhere, and how far the sampler's were from them.

A rollout engine that holds its own copy of a policy (vLLM, or the bfloat16 copy of ``policies/rollout_copy.py``)
samples from a slightly different distribution than the trainer scores: other kernels, another precision. The
loss must start from the trainer's own log-probs (the importance ratio is 1 before the first optimizer step), so
each sampled response is scored again with the trainer's model (``trainer_logprobs``), and the sampler's log-probs
only measure the difference: ``LogprobGap`` keeps mean and max ``|sampler - trainer|`` per policy, logged as
``rollout/logprob_gap/<policy>/{mean,max}``.
"""

from __future__ import annotations

import time
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


@torch.no_grad()
def trainer_logprobs(policy: TrainablePolicy, prompt_ids: list[list[int]], comps: list[list[Completion]],
                     temperature: float, gap: LogprobGap, token_budget: int = 16384) -> None:
    """Replace each completion's log-probs (``comps[i]``: the completions of ``prompt_ids[i]``) by ``policy``'s,
    scored shared-prefix at ``temperature`` in chunks of ``token_budget`` padded tokens; the replaced ones feed
    ``gap``. The model runs in eval mode, as sampling does."""
    from ..policies.shared_prefix import plan_chunks, shared_prefix_logprobs

    flat = [(p, c) for p, row in zip(prompt_ids, comps) for c in row if c.ids]
    was_training = policy.model.training
    policy.model.eval()
    try:
        for chunk in plan_chunks([p for p, _ in flat], [c.ids for _, c in flat], token_budget):
            ps, cs = [flat[i][0] for i in chunk], [flat[i][1] for i in chunk]
            logp, _ = shared_prefix_logprobs(policy, ps, [c.ids for c in cs], temperature)
            for row, c in zip(logp.float().cpu(), cs):
                mine = row[:len(c.ids)]
                gap.add(policy.policy_id, (mine - torch.tensor(c.logprobs)).abs())
                c.logprobs = mine.tolist()
    finally:
        policy.model.train(was_training)


class RescoredView:
    """The base of a rollout view that samples elsewhere (a ``protocol.Policy``): prompts are rendered, encoded and
    decoded by the trainer's ``policy`` (its other attributes too: tokenizer, eos_id ...), and ``rescore`` puts the
    trainer's log-probs into what was sampled, timing itself (``recompute_s``). Subclasses define ``generate``."""

    def __init__(self, policy: TrainablePolicy, gap: LogprobGap, token_budget: int = 16384):
        self.policy, self.gap, self.token_budget = policy, gap, token_budget
        self.policy_id = policy.policy_id
        self.recompute_s = 0.0

    def __getattr__(self, name: str):
        return getattr(self.__dict__["policy"], name)

    def render(self, prompt) -> str:
        return self.policy.render(prompt)

    def encode(self, text: str) -> list[int]:
        return self.policy.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.policy.decode(ids)

    def rescore(self, prompt_ids: list[list[int]], comps: list[list[Completion]], temperature: float
                ) -> list[list[Completion]]:
        """``comps`` with the trainer's log-probs (sampled ones: ``temperature > 0``; greedy has none)."""
        if temperature > 0 and comps:
            t = time.perf_counter()
            trainer_logprobs(self.policy, prompt_ids, comps, temperature, self.gap, self.token_budget)
            self.recompute_s += time.perf_counter() - t
        return comps
