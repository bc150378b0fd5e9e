"""The PPO clipped surrogate with GRPO advantages, and the optional KL penalty. Pure functions on tensors.

Per token: ratio = exp(logp - old_logp); loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A).
Aggregation (the paper uses token-mean):
- ``token-mean``: sum of token losses / number of response tokens in the *whole* mini-batch;
- ``seq-mean``: mean over tokens within each sequence, then sum / number of sequences in the mini-batch.
The normaliser is passed in, so gradient accumulation over micro-batches gives the same gradient as one
pass over the mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .names import AGGREGATIONS, KL_ESTIMATORS  # noqa: F401 (the options, defined without torch for the config)


@dataclass
class LossStats:
    """Sums over one batch's response tokens; a caller divides by ``tokens`` (over all its batches) to get the
    clip fraction, the approximate KL to the sampling policy and the KL penalty's estimate of the KL to the
    reference, logged as ``clipfrac``, ``approx_kl`` and ``ref_kl``."""

    clipped_tokens: float  # response tokens whose ratio was clipped
    kl_sum: float  # sum of 0.5 * (logp - old_logp)^2 over the response tokens
    tokens: int
    ref_kl_sum: float = 0.0  # sum of the KL penalty's per-token estimate (0 without a penalty)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimates from samples of pi (Schulman's k1, k2, k3). Shapes (B, T)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")


def ppo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float,
                   clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logp, old_logp  # (B, T); advantages  # (B,). Returns (loss  # (B, T), clipped  # (B, T) bool)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None]  # (B, 1)
    unclipped = ratio * adv
    clipped_obj = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped_obj)
    return loss, clipped_obj < unclipped


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, how: str, normalizer: float) -> torch.Tensor:
    """Reduce (B, T) token losses to a scalar. ``normalizer``: total tokens (token-mean) or sequences (seq-mean)
    of the whole mini-batch this micro-batch belongs to."""
    if how == "token-mean":
        return (token_loss * mask).sum() / normalizer
    if how == "seq-mean":
        per_seq = (token_loss * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,)
        return per_seq.sum() / normalizer
    raise ValueError(f"unknown loss aggregation {how!r}; valid: {', '.join(AGGREGATIONS)}")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float = 0.2, aggregation: str = "token-mean",
                normalizer: float | None = None, kl_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
                kl_estimator: str = "k3") -> tuple[torch.Tensor, LossStats]:
    """The AT-GRPO policy loss of one micro-batch. logp, old_logp, mask  # (B, T); advantages  # (B,)."""
    if normalizer is None:
        normalizer = float(mask.sum()) if aggregation == "token-mean" else float(mask.shape[0])
    token_loss, clipped = ppo_token_loss(logp, old_logp, advantages, clip_low, clip_high)
    ref_kl = None
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (log-probs under the frozen reference policy)")
        ref_kl = kl_penalty(logp, ref_logp, kl_estimator)  # (B, T)
        token_loss = token_loss + kl_coef * ref_kl
    loss = aggregate(token_loss, mask, aggregation, normalizer)
    with torch.no_grad():
        m = mask.bool()
        stats = LossStats(clipped_tokens=float(clipped[m].float().sum()),
                          kl_sum=float((0.5 * (logp - old_logp)[m] ** 2).sum()), tokens=int(m.sum()),
                          ref_kl_sum=float(ref_kl[m].sum()) if ref_kl is not None else 0.0)
    return loss, stats
