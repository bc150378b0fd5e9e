"""Supervised warm start on scripted demonstrations (a noisy expert), standing in for pretraining.

A tiny policy knows nothing at first. Each environment's expert (e.g. a BFS solver) acts in scripted
episodes on *training-split* problems, each character of its answer corrupted with probability ``noise``;
every (prompt, answer) pair trains the policy of the agent that produced it, with cross-entropy on the answer
tokens. Evaluation problems come from the disjoint evaluation split, so no demonstration is an eval problem.
"""

from __future__ import annotations

import random
from typing import Callable

import torch
from tqdm import tqdm

from ..config import WarmStartConfig
from ..envs import MultiAgentEnv
from ..policies.causal_lm import CausalLMPolicy

WARMSTART_SEED_OFFSET = 7_000_000_000  # demonstration problems use seeds far from the RL data sampler's


def collect_demonstrations(make_env: Callable[[str, int], MultiAgentEnv], agent_to_policy: dict[str, str],
                           policies: dict[str, CausalLMPolicy], cfg: WarmStartConfig, seed: int
                           ) -> dict[str, list[tuple[list[int], list[int]]]]:
    """(prompt ids, answer ids + EOS) pairs per policy id, from scripted noisy-expert episodes."""
    rng = random.Random(seed)
    demos: dict[str, list[tuple[list[int], list[int]]]] = {pid: [] for pid in policies}
    for ep in range(cfg.episodes):
        env = make_env("train", WARMSTART_SEED_OFFSET + seed * 1_000_000 + ep)
        while not env.done:
            agent = env.current_agent
            policy = policies[agent_to_policy[agent]]
            answer = env.demo_action(agent, rng, cfg.noise)
            prompt_ids = policy.encode(policy.render(env.observe()))
            answer_ids = policy.tokenizer.encode(answer) + [policy.eos_id]
            demos[policy.policy_id].append((prompt_ids, answer_ids))
            env.step(answer)
    return demos


def supervised_finetune(policy: CausalLMPolicy, pairs: list[tuple[list[int], list[int]]], cfg: WarmStartConfig,
                        seed: int, progress: bool = True) -> list[float]:
    """Cross-entropy on the answer tokens; returns the mean loss per epoch."""
    if not pairs:
        return []
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.lr, weight_decay=0.0)
    steps_total = cfg.epochs * ((len(pairs) + cfg.batch_size - 1) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.1, 1 - i / steps_total))
    policy.model.train()
    losses = []
    bar = tqdm(total=steps_total, desc=f"warm start [{policy.policy_id}]", disable=not progress, leave=False)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(pairs), generator=gen).tolist()
        total, count = 0.0, 0
        for start in range(0, len(order), cfg.batch_size):
            batch = [pairs[i] for i in order[start:start + cfg.batch_size]]
            logp, mask = policy.response_logprobs([p for p, _ in batch], [a for _, a in batch], temperature=1.0)
            loss = -(logp * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            opt.step()
            sched.step()
            total, count = total + loss.item(), count + 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        losses.append(total / max(1, count))
    bar.close()
    return losses


def warm_start(make_env, agent_to_policy, policies, cfg: WarmStartConfig, seed: int, progress: bool = True
               ) -> dict[str, list[float]]:
    """Collect demonstrations and fine-tune every policy on its own; returns the loss curve per policy."""
    demos = collect_demonstrations(make_env, agent_to_policy, policies, cfg, seed)
    return {pid: supervised_finetune(policies[pid], pairs, cfg, seed + n, progress)
            for n, (pid, pairs) in enumerate(sorted(demos.items()))}
