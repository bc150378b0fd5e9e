"""Rollouts: the AT-GRPO tree sampler and the plain multi-episode runner (eval, baselines)."""

from .records import EpisodeResult, Sample
from .sampling import Sampling
from .tree import trajectory_rollout, tree_rollout

__all__ = ["EpisodeResult", "Sample", "Sampling", "trajectory_rollout", "tree_rollout"]
