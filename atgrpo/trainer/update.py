"""One policy's update on its own fresh samples: one PPO epoch split into mini-batches (docs/method.md).

Old log-probs are the ones recorded at sampling time (same model, same temperature: the ratio starts at 1 up
to float noise). Samples drawn by another sampler (a bfloat16 rollout copy, vLLM: ``Sample.trainer_logprobs``
False) get the trainer's own before the first optimizer step (``take_trainer_logprobs``): the first mini-batch's
forward gives them as it computes the loss, the later mini-batches get one no-grad pass first. Gradient
accumulation over micro-batches uses the mini-batch's total token (or sequence) count as normaliser, so it
equals one pass over the mini-batch. With ``algo.shared_prefix`` (the default) each
distinct prompt of a micro-batch runs forward once and its responses run on its KV cache
(``policies/shared_prefix.py``): the same log-probs and gradients as one sequence per sample, less compute.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..algorithms.losses import LossStats, policy_loss
from ..config import AlgoConfig
from ..policies.protocol import TrainablePolicy
from ..policies.shared_prefix import group_by_prompt, plan_chunks, shared_prefix_logprobs
from ..rollout.logprob_gap import LogprobGap
from ..rollout.records import Sample
from .memory import MICRO_BATCH_TRIM_MIB, release_free_memory


@dataclass
class UpdateStats:
    loss: float = 0.0
    clipfrac: float = 0.0
    approx_kl: float = 0.0
    ref_kl: float | None = None  # the KL penalty's estimate of KL(policy || reference); None without a penalty
    grad_norm: float = 0.0
    tokens: int = 0
    samples: int = 0
    optimizer_steps: int = 0
    skipped_nonfinite: int = 0
    logprob_gap: dict[str, float] = field(default_factory=dict)  # rollout/logprob_gap/<policy>/{mean,max}
    rescore_s: float = 0.0  # the no-grad pass that scored samples owed the trainer's log-probs


def make_optimizer(policy: TrainablePolicy, algo: AlgoConfig) -> torch.optim.Optimizer:
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=algo.lr, weight_decay=algo.weight_decay, betas=(0.9, 0.999))


def warmup_lr(lr: float, steps_done: int, warmup_steps: int) -> float:
    """The learning rate of optimizer step ``steps_done + 1``: rising linearly, lr / W, 2 lr / W, ..., to ``lr``
    at step W = ``warmup_steps`` and constant after (W = 0: constant)."""
    return lr if warmup_steps <= 0 else lr * min(1.0, (steps_done + 1) / warmup_steps)


def optimizer_steps_done(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer steps taken so far, from AdamW's own per-parameter count (so it survives a checkpoint)."""
    for state in optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def _fill_least_loaded(groups: list[list[Sample]], n: int, weight: Callable[[list[Sample]], int]
                       ) -> list[list[Sample]]:
    """``n`` bins filled with ``groups`` in the order given, each group whole into the bin of least ``weight``
    so far (ties: the first such bin)."""
    bins: list[list[Sample]] = [[] for _ in range(n)]
    load = [0] * n
    for g in groups:
        b = min(range(n), key=lambda r: (load[r], r))
        bins[b] += g
        load[b] += weight(g)
    return bins


def _prompt_groups(samples: list[Sample]) -> list[list[Sample]]:
    """The samples grouped by identical prompt (``shared_prefix.group_by_prompt``), in order of first appearance."""
    return [[samples[i] for i in g] for g in group_by_prompt([s.prompt_ids for s in samples])]


def _tokens(group: list[Sample]) -> int:
    return sum(len(s.prompt_ids) + len(s.response_ids) for s in group)


def split_minibatches(samples: list[Sample], n: int, generator: torch.Generator) -> list[list[Sample]]:
    """One PPO epoch's ``n`` mini-batches. Whole prompt groups (the K responses to one prompt) stay in one
    mini-batch, so the shared-prefix pass runs each prompt once per step, not once per mini-batch. Groups are
    taken in random order (one ``randperm`` from ``generator``), each into the mini-batch with the fewest
    samples so far; fewer groups than ``n`` give fewer mini-batches."""
    groups = _prompt_groups(samples)
    order = torch.randperm(len(groups), generator=generator).tolist()
    return _fill_least_loaded([groups[g] for g in order], min(n, len(groups)), len)


def shard_minibatch(mb: list[Sample], world: int) -> list[list[Sample]]:
    """Split one mini-batch over ``world`` data-parallel ranks: whole prompt groups (shared-prefix scoring keeps
    its savings), largest first, each to the rank with the fewest tokens so far. Deterministic (no random draw)."""
    return _fill_least_loaded(sorted(_prompt_groups(mb), key=lambda g: -_tokens(g)), world, _tokens)


@dataclass
class MinibatchPlan:
    """One policy update (one PPO epoch) planned for ``world`` ranks: ``shards[rank][m]`` is the part of
    mini-batch ``m`` that ``rank`` trains on (possibly empty), ``normalizers[m]`` mini-batch ``m``'s loss
    normaliser over all ranks, ``n_samples`` the samples of the update. ``epoch_update`` runs one rank's part."""
    shards: list[list[list[Sample]]]
    normalizers: list[float]
    n_samples: int


def plan_minibatches(samples: list[Sample], algo: AlgoConfig, generator: torch.Generator, world: int = 1
                     ) -> MinibatchPlan:
    """The mini-batch planner of the local and the data-parallel (Ray) update: ``algo.minibatches`` mini-batches
    of whole prompt groups (``split_minibatches``: the update's only random draw), their normalisers, and with
    ``world > 1`` each mini-batch sharded over the ranks (``shard_minibatch``). With ``world == 1`` the one rank
    trains on the mini-batches as split, so the plan does not depend on the backend."""
    mbs = split_minibatches(samples, algo.minibatches, generator)
    norms = [minibatch_normalizer(mb, algo) for mb in mbs]
    if world == 1:
        return MinibatchPlan([mbs], norms, len(samples))
    per_mb = [shard_minibatch(mb, world) for mb in mbs]  # [m][rank]
    return MinibatchPlan([[sh[rank] for sh in per_mb] for rank in range(world)], norms, len(samples))


def micro_batches(mb: list[Sample], algo: AlgoConfig) -> list[list[Sample]]:
    """The forward/backward passes of one mini-batch: with ``algo.shared_prefix``, whole prompt groups packed
    under ``algo.update_token_budget`` padded tokens (and ``micro_batch_size`` sequences); else plain slices.
    Samples drawn at different temperatures (``rollout.per_agent``) go to different micro-batches, each scored
    at its own temperature; the mini-batch's loss and gradient are the same sum."""
    by_temp: dict[float | None, list[Sample]] = {}
    for s in mb:
        by_temp.setdefault(s.temperature, []).append(s)
    out: list[list[Sample]] = []
    for part in by_temp.values():
        if not algo.shared_prefix:
            out += [part[i:i + algo.micro_batch_size] for i in range(0, len(part), algo.micro_batch_size)]
            continue
        plan = plan_chunks([s.prompt_ids for s in part], [s.response_ids for s in part], algo.update_token_budget,
                           algo.micro_batch_size)
        out += [[part[i] for i in chunk] for chunk in plan]
    return out


def score(policy: TrainablePolicy, micro: list[Sample], temperature: float, algo: AlgoConfig):
    """``logp, mask  # (B, T)`` of the micro-batch's responses, shared-prefix or one sequence per sample."""
    fn = (lambda *a: shared_prefix_logprobs(policy, *a)) if algo.shared_prefix else policy.response_logprobs
    return fn([s.prompt_ids for s in micro], [s.response_ids for s in micro], temperature)


def _temperature(micro: list[Sample], temperature: float) -> float:
    """The micro-batch's sampling temperature (``micro_batches`` keeps one per micro-batch), else ``temperature``."""
    return micro[0].temperature if micro and micro[0].temperature is not None else temperature


def take_trainer_logprobs(policy_id: str, micro: list[Sample], logp: torch.Tensor, gap: LogprobGap) -> None:
    """Put the trainer's log-probs (``logp  # (B, T)``, ``micro`` scored before any optimizer step of this
    update) in place of the sampler's in every sample still owed them (``Sample.trainer_logprobs`` False); how
    far the sampler's were feeds ``gap``."""
    rows = logp.detach().float().cpu()
    for s, row in zip(micro, rows):
        if not s.trainer_logprobs:
            mine = row[:len(s.logprobs)]
            gap.add(policy_id, (mine - torch.tensor(s.logprobs)).abs())
            s.logprobs, s.trainer_logprobs = mine.tolist(), True


@torch.no_grad()
def score_owed(policy: TrainablePolicy, micros: list[list[Sample]], algo: AlgoConfig, temperature: float,
               gap: LogprobGap) -> None:
    """One no-grad pass over the micro-batches that hold samples owed the trainer's log-probs."""
    for micro in micros:
        if any(not s.trainer_logprobs for s in micro):
            logp, _ = score(policy, micro, _temperature(micro, temperature), algo)
            take_trainer_logprobs(policy.policy_id, micro, logp, gap)


def backward_micro_batch(policy: TrainablePolicy, micro: list[Sample], normalizer: float, algo: AlgoConfig,
                         temperature: float, reference: TrainablePolicy | None = None, weight: float = 1.0,
                         gap: LogprobGap | None = None) -> tuple[float, LossStats]:
    """Score one micro-batch, compute its share of the mini-batch loss (``normalizer``: the whole mini-batch's
    token or sequence count) and accumulate its gradients. Shared by the local and the data-parallel update.
    ``temperature`` applies to samples that do not record their own (``Sample.temperature``). ``weight`` scales
    the loss before the backward (0: a padding pass of the sharded update, which adds nothing). Samples owed the
    trainer's log-probs take this forward's (``gap``: where the difference goes), so they must come before the
    update's first optimizer step."""
    temperature = _temperature(micro, temperature)
    logp, mask = score(policy, micro, temperature, algo)
    if any(not s.trainer_logprobs for s in micro):
        take_trainer_logprobs(policy.policy_id, micro, logp, gap if gap is not None else LogprobGap())
    old = torch.zeros_like(logp)
    for i, s in enumerate(micro):
        old[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
    adv = torch.tensor([s.advantage for s in micro], dtype=logp.dtype, device=logp.device)
    ref_logp = None
    if algo.kl_coef > 0:
        if reference is None:
            raise ValueError("algo.kl_coef > 0 needs a frozen reference policy")
        with torch.no_grad():
            ref_logp, _ = score(reference, micro, temperature, algo)
    loss, ls = policy_loss(logp, old, adv, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                           aggregation=algo.aggregation, normalizer=normalizer, kl_coef=algo.kl_coef,
                           ref_logp=ref_logp, kl_estimator=algo.kl_estimator)
    (loss * weight if weight != 1.0 else loss).backward()
    release_free_memory(above_mib=MICRO_BATCH_TRIM_MIB)  # the holes its activations left (large heaps)
    return loss.item(), ls


def minibatch_normalizer(mb: list[Sample], algo: AlgoConfig) -> float:
    """The loss normaliser of one mini-batch: its response tokens (token-mean) or its sequences (seq-mean)."""
    return float(sum(len(s.response_ids) for s in mb)) if algo.aggregation == "token-mean" else float(len(mb))


def update_policy(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, samples: list[Sample],
                  algo: AlgoConfig, temperature: float, generator: torch.Generator,
                  reference: TrainablePolicy | None = None) -> UpdateStats:
    """One policy's update on its step's samples (one PPO epoch of ``algo.minibatches`` optimizer steps);
    ``reference``: the frozen policy of the KL penalty (needed when ``algo.kl_coef > 0``)."""
    if not samples:
        return UpdateStats()
    plan = plan_minibatches(samples, algo, generator)
    return epoch_update(policy, optimizer, plan.shards[0], plan.normalizers, plan.n_samples, algo, temperature,
                        reference)


def epoch_update(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, shards: list[list[Sample]],
                 normalizers: list[float], n_samples: int, algo: AlgoConfig, temperature: float,
                 reference: TrainablePolicy | None = None,
                 allreduce: Callable[[torch.Tensor], None] | None = None,
                 equal_passes: Callable[[list[int]], list[int]] | None = None) -> UpdateStats:
    """This rank's part of one policy update, a whole PPO epoch (one optimizer step per mini-batch):
    ``shards[m]`` is its share of mini-batch ``m`` (possibly empty),
    ``normalizers[m]`` that mini-batch's normaliser over all ranks; ``allreduce(t)`` sums ``t`` over the ranks
    in place (None: a single rank). Returns the statistics of the whole update (the same on every rank).

    ``equal_passes`` is given when the model is sharded (``trainer/fsdp.py``): its backward itself sums the
    gradients over the ranks, so ``allreduce`` sums only the statistics, and every rank must run the same number
    of forward/backward passes (each one all-gathers and reduce-scatters). ``equal_passes(counts)`` maps this
    rank's micro-batch count per mini-batch to the count every rank runs (the most of any rank); this rank runs
    the missing ones as zero-weight passes (``padding_sample``: they add nothing to gradients or statistics)."""
    stats = UpdateStats(samples=n_samples)
    policy.model.train()
    params = [p for p in policy.model.parameters() if p.requires_grad]
    loss_sum, clip_sum, kl_sum, ref_kl_sum = 0.0, 0.0, 0.0, 0.0
    micros = [micro_batches(mb, algo) if mb else [] for mb in shards]
    passes = equal_passes([len(m) for m in micros]) if equal_passes is not None else [len(m) for m in micros]
    gap = LogprobGap()
    later = [micro for mb_micros in micros[1:] for micro in mb_micros]
    if any(not s.trainer_logprobs for micro in later for s in micro):
        if equal_passes is not None:  # every rank would have to run the same number of extra passes
            raise ValueError("a sharded (FSDP) update cannot score samples from another sampler; rescore them "
                             "before the update")
        t = time.perf_counter()
        score_owed(policy, later, algo, temperature, gap)  # before the first optimizer step changes the weights
        stats.rescore_s = time.perf_counter() - t
    for mb_micros, n_passes, normalizer in zip(micros, passes, normalizers):
        optimizer.zero_grad(set_to_none=True)
        local = [0.0, 0.0, 0.0, 0.0, 0.0]  # this rank's loss, clipped tokens, kl sum, tokens, reference-kl sum
        for micro in mb_micros:
            loss_value, ls = backward_micro_batch(policy, micro, normalizer, algo, temperature, reference, gap=gap)
            local = [local[0] + loss_value, local[1] + ls.clipped_tokens, local[2] + ls.kl_sum, local[3] + ls.tokens,
                     local[4] + ls.ref_kl_sum]
        for _ in range(n_passes - len(mb_micros)):
            backward_micro_batch(policy, [padding_sample()], normalizer, algo, temperature, reference, weight=0.0)
        if equal_passes is not None:  # the backward passes summed the gradients already
            mb_loss, clip, kl, tokens, ref_kl = _allreduce_stats(local, allreduce, params[0].device)
        else:
            mb_loss, clip, kl, tokens, ref_kl = _allreduce_grads(params, local, allreduce)
        clip_sum, kl_sum, stats.tokens = clip_sum + clip, kl_sum + kl, stats.tokens + int(round(tokens))
        ref_kl_sum += ref_kl
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), algo.grad_clip))
        if not (math.isfinite(mb_loss) and math.isfinite(grad_norm)):
            optimizer.zero_grad(set_to_none=True)
            stats.skipped_nonfinite += 1
            continue
        if algo.warmup_steps:
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(algo.lr, optimizer_steps_done(optimizer), algo.warmup_steps)
        optimizer.step()
        release_free_memory()  # the mini-batch's freed activations: back to the system, not left as heap holes
        stats.optimizer_steps += 1
        stats.grad_norm = max(stats.grad_norm, grad_norm)
        loss_sum += mb_loss
    stats.loss = loss_sum / max(1, stats.optimizer_steps)
    stats.clipfrac = clip_sum / max(1, stats.tokens)
    stats.approx_kl = kl_sum / max(1, stats.tokens)
    if algo.kl_coef > 0:
        stats.ref_kl = ref_kl_sum / max(1, stats.tokens)
    stats.logprob_gap = gap.pop()
    optimizer.zero_grad(set_to_none=True)
    return stats


def padding_sample() -> Sample:
    """The one-token sample of a zero-weight pass (token id 0 exists in every vocabulary; prompt of two tokens,
    response of one): the cheapest input that runs every layer forward and backward like a real micro-batch."""
    return Sample(problem="", branch=0, turn=0, agent="", policy="", prompt="", prompt_ids=[0, 0], response="",
                  response_ids=[0], logprobs=[0.0], reward_team=0.0, reward_local=0.0, reward=0.0, selected=False,
                  finished=False)


def _allreduce_stats(local: list[float], allreduce: Callable[[torch.Tensor], None] | None,
                     device: torch.device) -> list[float]:
    """The ``local`` statistics summed over the ranks (float64: token counts stay exact)."""
    if allreduce is None:
        return local
    t = torch.tensor(local, dtype=torch.float64, device=device)
    allreduce(t)
    return t.tolist()


def _allreduce_grads(params: list[torch.nn.Parameter], local: list[float],
                     allreduce: Callable[[torch.Tensor], None] | None) -> list[float]:
    """Sum every parameter's gradient and the ``local`` statistics over the ranks with one all-reduce of one
    flat float32 buffer. A parameter without a gradient on every rank keeps none (AdamW then skips it, as in
    a single process)."""
    if allreduce is None:
        return local
    dev = params[0].device
    parts = [p.grad.detach().reshape(-1).float() if p.grad is not None else torch.zeros(p.numel(), device=dev)
             for p in params]
    has = torch.tensor([float(p.grad is not None) for p in params], device=dev)
    flat = torch.cat(parts + [has, torch.tensor(local, dtype=torch.float32, device=dev)])
    allreduce(flat)
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).to(p.dtype).clone()
        off += n
    for p, h in zip(params, flat[off:off + len(params)].tolist()):
        if h == 0:
            p.grad = None
    return flat[-len(local):].tolist()
