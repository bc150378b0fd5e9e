"""Typed records of what a rollout produced: one ``Sample`` per sampled response."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Sample:
    problem: str  # problem id, e.g. "plan_path/train/17"
    branch: int  # candidate index k in [0, K) at its node (tree) or trajectory index (trajectory mode)
    turn: int
    agent: str
    policy: str  # id of the policy that generated it (routing); never part of the group key
    prompt: str  # rendered prompt text
    prompt_ids: list[int]
    response: str
    response_ids: list[int]
    logprobs: list[float]  # sampling log-probs, one per response token
    reward_team: float
    reward_local: float
    reward: float  # alpha * reward_team + reward_local
    selected: bool  # this candidate's state was kept (tree mode); always True in trajectory mode
    finished: bool  # the response ended with EOS
    info: dict[str, Any] = field(default_factory=dict)
    episode_return: float | None = None  # trajectory mode: summed reward of its whole trajectory
    score: float = 0.0  # what its advantage is computed from, set by the rollout: ``reward`` (tree) or
    # ``episode_return`` (trajectory: classic GRPO)
    group: str = ""  # filled by the trainer
    advantage: float = 0.0  # filled by the trainer
    temperature: float | None = None  # the sampling temperature (the loss scores under the same one)
    trainer_logprobs: bool = True  # False: ``logprobs`` are another sampler's (a rollout copy, vLLM) until the
    # update puts the trainer's own in their place, before its first optimizer step

    def dump(self) -> dict[str, Any]:
        """The JSON line written to rollouts/step_<N>.jsonl (token ids and log-probs left out)."""
        d = asdict(self)
        for k in ("prompt_ids", "response_ids", "logprobs", "trainer_logprobs"):
            d.pop(k)
        return d


@dataclass
class EpisodeResult:
    problem: str
    success: bool
    turns: int
    returns: dict[str, float]  # summed reward per agent along the kept trajectory
    transcript: list[dict[str, Any]]  # (turn, agent, prompt, response, reward) of the kept trajectory
