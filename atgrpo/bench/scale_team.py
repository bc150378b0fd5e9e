"""The turns and agents axes of ``atgrpo bench scale``: a whole multi-turn, multi-agent tree rollout and its update.

At each point a team of ``agents`` roles acts in turn for ``turns`` turns (``ScriptedTurns``: exactly that many
(turn, agent) nodes) on ``prompts`` problems, sampled by the trainer's own tree sampler (``rollout.tree.tree_rollout``,
one shared policy for every role, as ``policy.sharing=L1`` routes it): at each node K candidates per problem from one
batched ``generate``, each stepped on its own clone, the best kept, the next prompt grown by the kept response.
The methods, as on the other axes:

- ``rollout_tree``: that rollout as shipped (each node's prompts prefilled once, their K branches decoded together);
- ``rollout_per_branch``: the same tree sampler with every node's K branches asked one ``generate([prompt], n=1)``
  at a time (``PerBranch``): each branch prefills its prompt, as the reference code's requests do;
- ``update_shared_prefix`` / ``update_per_sample``: one forward + backward of the PPO loss over the samples the
  rollout produced (every node's K responses, their log-probs as sampled), the shared-prefix loss as shipped
  against one sequence per sample (``bench.update.loss_backward``, micro-batched as ``update_policy`` does; the
  per-sample micro-batches hold at most ``token_budget`` padded tokens, the budget the shared-prefix ones are
  packed under, as a user sets ``algo.micro_batch_size`` for long sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..rollout.sampling import Sampling
from ..rollout.tree import tree_rollout
from .common import Shape, bench_prompts
from .scripted_turns import ScriptedTurns, team_roles
from .update import loss_backward, model_flops

SHARED_PREFIX_ROWS = 16  # responses per shared-prefix micro-batch at least, as the real configs set micro_batch_size


def shared_prefix_algo(algo):
    """The update settings the shared-prefix loss runs under: the shape's, with at least ``SHARED_PREFIX_ROWS``
    responses per micro-batch (under the same token budget). A preset's small ``micro_batch_size`` is for the
    per-sample baseline's memory (whole sequences); capping the shared prefix's rows there too would run each
    prompt again for every two responses, which is not how the trainer is configured (``configs/real``: 16)."""
    return replace(algo, micro_batch_size=max(algo.micro_batch_size, SHARED_PREFIX_ROWS))



@dataclass
class ScaleShape(Shape):
    """A benchmark shape with a team: ``turns`` and ``agents`` (the turns and agents axes' rollout); the other axes
    time one node and ignore them."""

    turns: int = 2
    agents: int = 2


class PerBranch:
    """A policy whose ``generate(prompts, n)`` asks each prompt's n branches one request at a time (each prefills
    its prompt); everything else is the wrapped policy's. The per-branch baseline of a tree rollout."""

    def __init__(self, policy):
        self.policy = policy

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def generate(self, prompt_ids, n, temperature, max_new_tokens, generator=None):
        return [[self.policy.generate([p], 1, temperature, max_new_tokens, generator)[0][0] for _ in range(n)]
                for p in prompt_ids]


def team_envs(shape: ScaleShape, policy) -> list[ScriptedTurns]:
    """One scripted team per problem, reset; the problem texts are the benchmark's prompts (``bench_prompts``)."""
    envs = []
    for i, text in enumerate(bench_prompts(shape, policy)):
        env = ScriptedTurns(text, agents=shape.agents, max_turns=shape.turns)
        env.reset(shape.seed + i)
        envs.append(env)
    return envs


def team_methods(shape: ScaleShape, policy) -> tuple[dict[str, Callable[[], object]], dict[str, int], dict]:
    """The four methods at one point, the tokens each handles (sampled, or scored by the update) and what the
    point's rollout looked like (nodes, samples, prompt tokens). One tree rollout is run first: its samples are
    the update's batch."""
    envs = team_envs(shape, policy)
    routes = {role: policy.policy_id for role in team_roles(shape.agents)}
    sampling = Sampling(K=shape.K, temperature=1.0, max_new_tokens=shape.new_tokens)
    gen = torch.Generator().manual_seed(shape.seed)

    def rollout(pol):
        return lambda: tree_rollout(envs, {policy.policy_id: pol}, routes, sampling, gen)

    samples, episodes = rollout(policy)()
    prompts, responses = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
    if len({len(r) for r in responses}) != 1:
        raise RuntimeError("bench scale: responses of unequal length (is EOS suppressed?)")
    old = torch.tensor([s.logprobs for s in samples])
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(shape.seed + 2))
    algo = shape.algo()
    # per-sample micro-batches under the same padded-token budget the shared-prefix ones are packed under: with
    # prompts grown by the transcript, 256 sequences in one float32 micro-batch of the tiny model need >10 GB
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    per_sample = replace(algo, micro_batch_size=max(1, min(algo.micro_batch_size, algo.update_token_budget // longest)))

    methods = {"rollout_tree": rollout(policy), "rollout_per_branch": rollout(PerBranch(policy)),
               **update_methods(policy, prompts, responses, old, adv, algo, per_sample)}
    tokens = sum(len(r) for r in responses)
    plens = [len(p) for p in prompts]
    info = {"nodes": len({(s.turn, s.agent) for s in samples}), "samples": len(samples),
            "per_sample_micro_batch": per_sample.micro_batch_size,
            "turns_run": max(e.turns for e in episodes), "prompt_tokens_mean": sum(plens) / len(plens),
            "prompt_tokens_max": max(plens), "update_gflop": update_gflop(policy, prompts, responses)}
    return methods, dict.fromkeys(methods, tokens), info


def update_methods(policy, prompts, responses, old, adv, algo, per_sample_algo) -> dict[str, Callable[[], None]]:
    """One forward + backward of the PPO loss over the batch: the shared-prefix loss under ``shared_prefix_algo``
    and the per-sample loss under ``per_sample_algo``, each from zeroed gradients."""
    def method(shared, run_algo):
        def f():
            policy.model.zero_grad(set_to_none=True)
            loss_backward(policy, prompts, responses, old, adv, shared, run_algo)
        return f

    return {"update_shared_prefix": method(True, shared_prefix_algo(algo)),
            "update_per_sample": method(False, per_sample_algo)}


def update_gflop(policy, prompts, responses) -> dict[str, float]:
    """Model GFLOP of one forward + backward of the batch, shared prefix and per sample (``update.model_flops``)."""
    return {"shared_prefix": model_flops(policy, prompts, responses, True) / 1e9,
            "per_sample": model_flops(policy, prompts, responses, False) / 1e9}
