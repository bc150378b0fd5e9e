"""Where a train step's work runs: the ``Backend`` protocol (what ``step.py`` calls on ``state.backend``) and
``LocalBackend``, everything in this process.

Implementations: ``LocalBackend`` (here), ``vllm_backend.VLLMBackend`` (the local backend with rollouts sampled on
vLLM) and ``ray.driver.RayBackend`` (rollout, update and environment workers on Ray, docs/ray.md).
tests/test_protocols.py checks that each has the calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import torch

from ..policies.rollout_copy import RolloutCopies
from ..rollout.records import Sample
from ..rollout.tree import step_clones
from .update import update_policy

if TYPE_CHECKING:
    from ..envs import MultiAgentEnv
    from ..envs.base import StepResult
    from ..policies.protocol import Policy
    from .state import TrainState
    from .update import UpdateStats


@runtime_checkable
class Backend(Protocol):
    """The calls ``step.train_step`` (and the run, around it) makes on ``state.backend``. Whatever the backend,
    the step's samples, advantages and updates follow the same algorithm; only where they are computed differs."""

    def rollout_policies(self, state: TrainState) -> dict[str, Policy]:
        """The policies the rollout samples from, by policy id, with the current weights of ``state.policies``
        (the same objects, or views of them that sample elsewhere)."""
        ...

    def eval_policies(self, state: TrainState) -> dict[str, Policy]:
        """The policies held-out evaluation samples from (greedy), by policy id, with the current weights."""
        ...

    def step_envs(self, envs: Sequence[MultiAgentEnv], texts: Sequence[Sequence[str]]
                  ) -> list[tuple[list[MultiAgentEnv], list[StepResult]]]:
        """``rollout.tree.step_clones``, wherever it runs: candidate k of ``envs[i]`` is ``texts[i][k]``, stepped
        on its own clone of ``envs[i]`` (not mutated); per env ``(children, results)`` in input order."""
        ...

    def update(self, state: TrainState, batches: dict[str, list[Sample]]) -> dict[str, UpdateStats]:
        """Each policy's update on its own batch (``update.update_policy``'s algorithm, one PPO epoch, drawing
        from ``state.generator`` in policy order); afterwards ``state.policies`` and the policies the next
        ``rollout_policies`` returns hold the new weights (on-policy)."""
        ...

    def step_metrics(self) -> dict[str, float]:
        """The backend's own metrics since the last call (timings, counters); empty for the local backend."""
        ...

    def pull_state(self, state: TrainState) -> None:
        """Bring into ``state`` whatever lives elsewhere (optimizer states), before a checkpoint is written."""
        ...

    def close(self) -> None:
        """Release workers, engines and temporary files; the backend is not used afterwards."""
        ...


class LocalBackend:
    """Everything in this process: the policies generate and train here, the environments step here.

    With ``rollout_dtype`` (``model.precision: bfloat16`` on float32 weights) the rollout and the evaluation
    sample from copies of the policies in that dtype (``policies/rollout_copy.py``), made at first use (after the
    warm start or the resume) and refreshed after every update."""

    rollout_dtype: torch.dtype | None = None
    copies: RolloutCopies | None = None

    def __init__(self, rollout_dtype: torch.dtype | None = None):
        self.rollout_dtype = rollout_dtype

    def _views(self, state: TrainState) -> dict[str, Policy]:
        if self.rollout_dtype is None:
            return state.policies
        if self.copies is None:
            self.copies = RolloutCopies(state.policies, self.rollout_dtype)
        return self.copies.views

    def rollout_policies(self, state: TrainState) -> dict[str, Policy]:
        return self._views(state)

    def eval_policies(self, state: TrainState) -> dict[str, Policy]:
        return self._views(state)

    def step_envs(self, envs, texts):
        return step_clones(envs, texts)

    def update(self, state: TrainState, batches: dict[str, list[Sample]]) -> dict[str, UpdateStats]:
        cfg = state.cfg
        # the native engine's packed weights: stale after this update anyway; its activations get their memory
        for sampler in ([v.sampler for v in self.copies.views.values()] if self.copies is not None
                        else state.policies.values()):
            if hasattr(sampler, "release_decoder_weights"):
                sampler.release_decoder_weights()
        if self.copies is not None:  # the update changes what the copies hold: they are made again after it
            self.copies.release([pid for pid, batch in batches.items() if batch])
        out = {pid: update_policy(state.policies[pid], state.optimizers[pid], batch, cfg.algo,
                                  cfg.rollout.temperature, state.generator, state.references.get(pid))
               for pid, batch in batches.items()}
        if self.copies is not None:  # on-policy: the next rollout samples from the new weights
            self.copies.refresh([pid for pid, batch in batches.items() if batch])
        return out

    def step_metrics(self) -> dict[str, float]:
        return self.copies.pop_metrics() if self.copies is not None else {}

    def pull_state(self, state: TrainState) -> None:  # before a checkpoint: the state is already here
        pass

    def close(self) -> None:
        pass
