"""A sharded update of one policy over the ranks of its process group: FSDP2 (``torch.distributed.fsdp.fully_shard``).

What is sharded: every parameter, its gradient and its optimizer state (AdamW's moments) are split over the ranks
(``DTensor`` shards on dim 0); each decoder layer, then the root (embeddings, final norm, output layer), is one
FSDP unit whose full weights are all-gathered for its forward and its backward and freed after. The frozen KL
reference (``algo.kl_coef > 0``) stays a full copy on every rank: it is only scored, under ``no_grad``.

What is summed: each rank's loss is its share of the *global* mini-batch mean (``update.plan_minibatches``: the
normaliser is the whole mini-batch's), so the right gradient is the sum over ranks. FSDP2 averages by default;
``shard_model`` sets the divide factor to 1 with sum-only reductions, so the reduce-scatter of each backward is
a plain ``SUM``. The statistics (loss, clipped tokens, KL, tokens) are summed with one all-reduce per
mini-batch, and ``clip_grad_norm_`` on the sharded gradients computes the global norm, so every rank clips,
steps and reports the same.

The equal-pass rule: each FSDP unit's forward is an all-gather and its backward a reduce-scatter, collectives
that every rank must enter the same number of times in the same order. A rank's shard of a mini-batch may hold
fewer micro-batches than another's, or none, so the ranks agree on the most passes of any rank (one all-reduce
``MAX`` per update) and a rank short of passes runs zero-weight ones (``update.padding_sample``, its loss times
0: gradients and statistics unchanged). Without this a rank with less data would leave the update early and the
others would wait for it forever.

The loop itself is the local update's (``update.epoch_update``, with ``equal_passes``); so is the shared-prefix
forward (prefix-tree attention switched on around the model call, which FSDP's hooks do not see).

Weights and optimizer state move in and out as *full* state dicts (``load_full_state``, ``full_trainable_state``,
``full_optimizer_state``: collectives, every rank calls them), in the formats of an unsharded process
(``ray.workers.trainable_state``, ``optimizer.state_dict()``), so the Ray driver and checkpoints need not know
that a policy is sharded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, fully_shard

from ..config import AlgoConfig
from ..policies.protocol import TrainablePolicy
from ..rollout.records import Sample
from .update import UpdateStats, epoch_update


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the first module list in module order (transformers' ``model.layers``).
    Lists nested inside a layer stay part of their layer's unit."""
    return next((list(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)), [])


def shard_model(model: torch.nn.Module, mesh=None) -> FSDPModule:
    """Shard ``model`` in place over the default process group (or ``mesh``): each decoder layer, then the root.
    Gradients are summed over the ranks, not averaged (see the module's docstring). Call it before building the
    optimizer (``update.make_optimizer``): the parameters become ``DTensor`` shards."""
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):  # divide by 1 with a plain SUM reduce-scatter (gloo has no PREMUL_SUM)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def max_over_ranks(counts: list[int], device: torch.device, group=None) -> list[int]:
    """Element-wise most of ``counts`` over the ranks (a collective: every rank calls it; ``device``: where the
    backend communicates, the CPU for gloo, the GPU for nccl)."""
    t = torch.tensor(counts, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def sharded_epoch_update(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, shards: list[list[Sample]],
                         normalizers: list[float], n_samples: int, algo: AlgoConfig, temperature: float,
                         reference: TrainablePolicy | None = None, group=None) -> UpdateStats:
    """This rank's part of one policy update with ``policy.model`` sharded by ``shard_model`` (a collective:
    every rank of ``group`` calls it with its ``MinibatchPlan.shards[rank]``). The same arguments and the same
    result as ``update.epoch_update``: the statistics of the whole update, equal on every rank."""
    device = next(policy.model.parameters()).device

    def allreduce(t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)

    return epoch_update(policy, optimizer, shards, normalizers, n_samples, algo, temperature, reference,
                        allreduce=allreduce, equal_passes=lambda counts: max_over_ranks(counts, device, group))


def _trainable_names(model: torch.nn.Module) -> list[str]:
    """The trainable parameters' names in ``model.parameters()`` order: index ``i`` of an ``optimizer.state_dict()``
    made by ``update.make_optimizer`` (FSDP2 keeps names and order)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def load_full_state(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                    optimizer_state: dict | None = None) -> None:
    """Load full trainable ``weights`` (every rank has them all; each keeps its shard) and an unsharded
    ``optimizer.state_dict()`` into the sharded ``policy``. A collective."""
    full = StateDictOptions(full_state_dict=True, strict=False)
    names = _trainable_names(policy.model)
    if set(weights) != set(names):
        raise RuntimeError(f"weight sync: names differ; missing {sorted(set(names) - set(weights))[:5]}, "
                           f"unexpected {sorted(set(weights) - set(names))[:5]}")
    set_model_state_dict(policy.model, dict(weights), options=full)  # a copy: it rewrites the dict it is given
    if optimizer_state is None:
        return
    if not optimizer_state["state"]:  # no step yet: set_optimizer_state_dict would initialise the state with a
        for g, saved in zip(optimizer.param_groups, optimizer_state["param_groups"]):  # zero-gradient step
            g.update({k: v for k, v in saved.items() if k != "params"})  # (AdamW's step count 1, not 0)
        optimizer.state.clear()
        return
    by_name = {"state": {names[i]: v for i, v in optimizer_state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                for g in optimizer_state["param_groups"]]}
    set_optimizer_state_dict(policy.model, optimizer, by_name, options=full)


def full_trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full trainable weights on the CPU on rank 0 ({} on the others). A collective."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {n: full[n] for n in _trainable_names(model)} if full else {}


def full_optimizer_state(policy: TrainablePolicy, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's full state as an unsharded ``optimizer.state_dict()`` (parameters by index) on rank 0,
    {} on the others. A collective."""
    full = get_optimizer_state_dict(policy.model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return {}
    index = {n: i for i, n in enumerate(_trainable_names(policy.model))}
    return {"state": {index[n]: v for n, v in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}
