"""Supervised warm start on scripted demonstrations (a noisy expert), standing in for pretraining.

A tiny policy knows nothing at first. Each environment's expert (e.g. a BFS solver) acts in scripted
episodes on *training-split* problems, each character of its answer corrupted with probability ``noise`` (in
the program-writing and code tasks: a bug made); every (prompt, answer) pair trains the policy of the agent that
produced it, with cross-entropy on the answer tokens. With ``warmstart.imitate=expert`` the answer trained on is
the expert's in the same state instead, while the episode goes on with the noisy one: the noise then only makes
the states a policy must recover from, and no mistake is imitated. Evaluation problems come from the disjoint
evaluation split, so no demonstration is an eval problem.

The same code warm-starts real models (``model.kind=hf``): prompts are rendered exactly as in rollouts (the
chat template with its generation prompt) and answers are tokenised as the policy emits them
(``TrainablePolicy.encode_response``: no BOS, EOS at the end). With several policies (L2: one LoRA adapter
per role; L3: one model per role) the warm start is by default common (``warmstart.common``): one policy is
fine-tuned on every role's demonstrations, as L1's one policy is, and its weights are copied to the others, so
all roles start from one checkpoint, as in the paper all start from one pretrained model, and then specialise
in RL. ``warmstart.common=false`` fine-tunes each policy on its own roles' demonstrations only. Batches are scored as the update scores
them (``shared_prefix_logprobs``: output-layer logits only at answer positions) in micro-batches of at most
``warmstart.token_budget`` padded tokens, with gradients accumulated to one optimizer step per batch.
"""

from __future__ import annotations

import random
from typing import Callable

import torch
from tqdm import tqdm

from ..config import WarmStartConfig
from ..envs import MultiAgentEnv
from ..policies.protocol import TrainablePolicy
from ..policies.shared_prefix import plan_chunks, shared_prefix_logprobs
from .memory import MICRO_BATCH_TRIM_MIB, release_free_memory
from .update import warmup_lr

WARMSTART_SEED_OFFSET = 7_000_000_000  # demonstration problems use seeds far from the RL data sampler's


def collect_demonstrations(make_env: Callable[[str, int], MultiAgentEnv], agent_to_policy: dict[str, str],
                           policies: dict[str, TrainablePolicy], cfg: WarmStartConfig, seed: int
                           ) -> dict[str, list[tuple[list[int], list[int]]]]:
    """(prompt ids, answer ids + EOS) pairs per policy id, from scripted noisy-expert episodes; the answer is
    the one played (``cfg.imitate == "noisy"``) or the expert's in that state (``"expert"``)."""
    rng = random.Random(seed)
    demos: dict[str, list[tuple[list[int], list[int]]]] = {pid: [] for pid in policies}
    for ep in range(cfg.episodes):
        env = make_env("train", WARMSTART_SEED_OFFSET + seed * 1_000_000 + ep)
        while not env.done:
            agent = env.current_agent
            policy = policies[agent_to_policy[agent]]
            answer = env.demo_action(agent, rng, cfg.noise)
            target = env.expert_action(agent) if cfg.imitate == "expert" else answer
            prompt_ids = policy.encode(policy.render(env.observe()))
            answer_ids = policy.encode_response(target)
            demos[policy.policy_id].append((prompt_ids, answer_ids))
            env.step(answer)
    return demos


def warmstart_lr_factor(step: int, steps_total: int, warmup_steps: int) -> float:
    """The warm start's learning-rate multiplier at optimizer step ``step`` (0-based): a linear warm-up over
    ``warmup_steps`` steps times a linear decay to 0.1 over ``steps_total``. The two overlap: a warm start of
    10 steps under a 20-step warm-up never passes 0.15 of ``warmstart.lr``; set ``warmstart.warmup_steps``
    well below the step count to reach it."""
    return warmup_lr(1.0, step, warmup_steps) * max(0.1, 1 - step / steps_total)


def supervised_finetune(policy: TrainablePolicy, pairs: list[tuple[list[int], list[int]]], cfg: WarmStartConfig,
                        seed: int, progress: bool = True) -> list[float]:
    """Cross-entropy on the answer tokens (token mean over each batch); returns the mean loss per epoch."""
    if not pairs:
        return []
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    steps_total = cfg.epochs * ((len(pairs) + cfg.batch_size - 1) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: warmstart_lr_factor(i, steps_total, cfg.warmup_steps))
    policy.model.train()
    losses = []
    bar = tqdm(total=steps_total, desc=f"warm start [{policy.policy_id}]", disable=not progress, leave=False)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(pairs), generator=gen).tolist()
        total, count = 0.0, 0
        for start in range(0, len(order), cfg.batch_size):
            batch = [pairs[i] for i in order[start:start + cfg.batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = batch_cross_entropy(policy, batch, cfg.token_budget)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            release_free_memory()  # the batch's freed activations go back to the system (``trainer/memory.py``)
            sched.step()
            total, count = total + loss, count + 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
        losses.append(total / max(1, count))
    bar.close()
    opt.zero_grad(set_to_none=True)  # the last batch's gradients: not held through the evaluation and the rollout
    return losses


def batch_cross_entropy(policy: TrainablePolicy, batch: list[tuple[list[int], list[int]]], token_budget: int
                        ) -> float:
    """Accumulate the gradient of the batch's token-mean cross-entropy on the answers, one backward per
    micro-batch of at most ``token_budget`` padded tokens (``plan_chunks``); returns the loss."""
    prompts, answers = [p for p, _ in batch], [a for _, a in batch]
    normalizer = float(sum(len(a) for a in answers))
    total = 0.0
    for idx in plan_chunks(prompts, answers, token_budget):
        logp, mask = shared_prefix_logprobs(policy, [prompts[i] for i in idx], [answers[i] for i in idx], 1.0)
        loss = -(logp * mask).sum() / normalizer
        loss.backward()
        release_free_memory(above_mib=MICRO_BATCH_TRIM_MIB)  # the holes its activations left (large heaps)
        total += loss.item()
    return total


def warm_start(make_env, agent_to_policy, policies, cfg: WarmStartConfig, seed: int, progress: bool = True
               ) -> dict[str, list[float]]:
    """Collect demonstrations and fine-tune: common (one policy on all of them, its weights copied to the
    others) or each policy on its own (see the module docstring). Returns the loss curve per policy."""
    demos = collect_demonstrations(make_env, agent_to_policy, policies, cfg, seed)
    ids = sorted(demos)
    if cfg.common and len(ids) > 1:
        losses = supervised_finetune(policies[ids[0]], [pair for pid in ids for pair in demos[pid]], cfg, seed,
                                     progress)
        weights = policies[ids[0]].model.state_dict()  # L2: the adapter's weights under adapter-free names
        for pid in ids[1:]:
            policies[pid].model.load_state_dict(weights)
        return {pid: losses for pid in ids}
    return {pid: supervised_finetune(policies[pid], demos[pid], cfg, seed + n, progress) for n, pid in enumerate(ids)}
