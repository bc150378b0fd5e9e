"""Group-relative advantages (GRPO): A = (r - mean_g) / (std_g + eps), per group g.

With ``std_normalize=False`` the advantage is ``r - mean_g`` (Dr. GRPO style). A group whose rewards are all
equal has A = 0 everywhere and carries no learning signal; ``zero_variance`` marks its members so the trainer
can filter them.
"""

from __future__ import annotations

import torch


def grouped_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, std_normalize: bool = True,
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards  # (N,) float; group_ids  # (N,) long in [0, G).

    Returns ``advantages  # (N,)`` and ``zero_variance  # (N,) bool``. std is the population std of the
    group (divisor n), so a group of K equal rewards has exactly zero advantage.
    """
    rewards = rewards.double()
    G = int(group_ids.max()) + 1 if group_ids.numel() else 0
    count = torch.zeros(G, dtype=torch.double).index_add_(0, group_ids, torch.ones_like(rewards))  # (G,)
    mean = torch.zeros(G, dtype=torch.double).index_add_(0, group_ids, rewards) / count  # (G,)
    centered = rewards - mean[group_ids]  # (N,)
    var = torch.zeros(G, dtype=torch.double).index_add_(0, group_ids, centered**2) / count  # (G,)
    std = var.sqrt()[group_ids]  # (N,)
    zero_variance = std < 1e-9
    adv = centered / (std + eps) if std_normalize else centered
    adv = torch.where(zero_variance, torch.zeros_like(adv), adv)
    return adv.float(), zero_variance
