"""The model side of the Ray backend (``driver.py`` places it): rollout and update workers (actors), the driver's
``RemotePolicy`` in front of a policy's rollout workers, and weight transfer (``trainable_state``,
``load_trainable``). This module never imports the driver.

Every worker builds its policy as a local run does (``setup.build_policy``) and then receives its
weights from the driver. Only parameters with ``requires_grad`` travel (``trainable_state``): the whole model
for L0/L1/L3, the role's adapter alone for per-role LoRA (L2); frozen weights are rebuilt identically from the
config (the seeded tiny model, or the same local Hugging Face files).

Update workers of one policy train data-parallel (``update.epoch_update``, the loop of a local update too):
every rank gets a shard of each mini-batch, scales its loss by the *global* mini-batch normaliser (tokens for
token-mean, sequences for seq-mean), and one all-reduce per mini-batch sums the gradients together with the loss
statistics; every rank then clips and steps identically. The driver plans the mini-batches with the local
update's planner (``update.plan_minibatches`` on the run's generator, sharded over the ranks), so the result
equals the single-process ``update.update_policy`` up to float summation order (tests/test_ray_backend.py
compares the two).

With ``system.ray.update_sharding=fsdp`` (and more than one update worker) each rank instead holds a shard of
the policy (``trainer/fsdp.py``: FSDP2, gradients summed by the backward's reduce-scatter) and runs
``fsdp.sharded_epoch_update``. Loading weights and optimizer state into the ranks and reading them out are then
collectives (``torch.distributed.checkpoint.state_dict``, full state dicts): the driver calls ``load``,
``weights`` and ``optimizer_state`` on every rank of the pool, and only rank 0 returns the full state.
"""

from __future__ import annotations

import os
import socket

import ray
import torch
import torch.distributed as dist

from ...config import Config
from ...rollout.records import Sample
from ..setup import build_policy
from ..update import UpdateStats, epoch_update, make_optimizer
from .faults import gather
from .partition import split_even


# ---- weights ------------------------------------------------------------------------------------------
def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, on the CPU (what weight sync sends: LoRA adapters only for L2)."""
    return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (from ``trainable_state``) into ``model`` in place (optimizers keep their tensors)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(weights):
        raise RuntimeError(f"weight sync: names differ; missing {sorted(set(params) - set(weights))[:5]}, "
                           f"unexpected {sorted(set(weights) - set(params))[:5]}")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(weights[n])


def _worker_cfg(cfg: Config) -> Config:
    """A GPU worker (Ray set CUDA_VISIBLE_DEVICES for it) puts its model on cuda."""
    if cfg.system.ray.gpus_per_worker > 0 and torch.cuda.is_available():
        cfg.model.device = "cuda"
    return cfg


# ---- driver side: the rollout workers behind a policy -----------------------------------------------------
class RemotePolicy:
    """The driver's face of a policy whose ``generate`` runs on its rollout workers. Prompts are rendered and
    tokenised here (by the driver's copy); the rollout loop (``rollout/tree.py``) cannot tell the difference."""

    def __init__(self, local, workers: list, names: list[str] | None = None):
        self.local, self.workers, self.policy_id = local, workers, local.policy_id
        self.names = names or [f"rollout worker {i}" for i in range(len(workers))]

    def render(self, prompt):
        return self.local.render(prompt)

    def encode(self, text: str) -> list[int]:
        return self.local.encode(text)

    def decode(self, ids) -> str:  # rollout.per_agent.<role>.stop cuts responses with the driver's tokenizer
        return self.local.decode(ids)

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 generator=None):
        if not prompt_ids:
            return []
        if len(self.workers) == 1:  # the run's own random stream: identical to the local backend
            state = generator.get_state() if generator is not None else None
            [(comps, state)] = gather([self.workers[0].generate.remote(prompt_ids, n, temperature, max_new_tokens,
                                                                       state)], self.names[:1])
            if generator is not None:
                generator.set_state(state)
            return comps
        parts = [p for p in split_even(list(range(len(prompt_ids))), len(self.workers)) if p]
        seeds = torch.randint(0, 2**62, (len(parts),), generator=generator).tolist()
        refs = [w.generate.remote([prompt_ids[i] for i in part], n, temperature, max_new_tokens, seed)
                for w, part, seed in zip(self.workers, parts, seeds)]
        return [c for comps, _ in gather(refs, self.names[:len(refs)]) for c in comps]


# ---- actors ----------------------------------------------------------------------------------------------
@ray.remote
class RolloutWorker:
    """Inference for one policy: ``generate`` with the driver's generator state (returned advanced)."""

    def __init__(self, cfg: Config, pid: str, policy_ids: list[str]):
        self.policy = build_policy(_worker_cfg(cfg), pid, policy_ids)

    def ready(self) -> int:
        return os.getpid()

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        load_trainable(self.policy.model, weights)

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 rng: torch.Tensor | int | None):
        """``rng``: a generator state (returned advanced), a seed, or None (the process's global RNG)."""
        gen = None
        if rng is not None:
            gen = torch.Generator()
            gen.set_state(rng) if isinstance(rng, torch.Tensor) else gen.manual_seed(int(rng))
        comps = self.policy.generate(prompt_ids, n, temperature, max_new_tokens, gen)
        return comps, (gen.get_state() if gen is not None else None)


@ray.remote
class UpdateWorker:
    """One rank of one policy's data-parallel optimisation (its own optimizer, same state on every rank)."""

    def __init__(self, cfg: Config, pid: str, policy_ids: list[str], rank: int, world: int):
        self.cfg, self.pid, self.policy_ids, self.rank, self.world = _worker_cfg(cfg), pid, policy_ids, rank, world
        self.policy = build_policy(self.cfg, pid, policy_ids)
        self.optimizer = make_optimizer(self.policy, self.cfg.algo)
        self.reference = None

    def ready(self) -> int:
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """(this node's address, a free port): rank 0's, where the process group meets."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    @property
    def sharded(self) -> bool:
        """Whether this rank holds a shard of the policy (FSDP2) rather than a full replica."""
        return self.world > 1 and self.cfg.system.ray.update_sharding == "fsdp"

    def init_group(self, addr: str, port: int) -> None:
        """Join the policy's process group; with fsdp, shard the policy and build the optimizer on the shards."""
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if self.cfg.model.device.startswith("cuda") else "gloo"
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                    world_size=self.world)
            if self.sharded:
                from ..fsdp import shard_model

                shard_model(self.policy.model)
                self.optimizer = make_optimizer(self.policy, self.cfg.algo)

    def load(self, weights, optimizer_state=None, reference=None) -> None:
        """The driver's trainable weights, optimizer state and KL reference (sharded: a collective, every rank)."""
        if self.sharded:
            from ..fsdp import load_full_state

            load_full_state(self.policy, self.optimizer, weights, optimizer_state)
        else:
            load_trainable(self.policy.model, weights)
            if optimizer_state is not None:
                self.optimizer.load_state_dict(optimizer_state)
        if reference is not None:  # the frozen KL reference (scored under no_grad only; never sharded)
            if self.reference is None:
                self.reference = build_policy(self.cfg, self.pid, self.policy_ids)
            load_trainable(self.reference.model, reference)

    def weights(self) -> dict[str, torch.Tensor]:
        """The trainable weights (sharded: a collective; the full weights on rank 0, {} elsewhere)."""
        if self.sharded:
            from ..fsdp import full_trainable_state

            return full_trainable_state(self.policy.model)
        return trainable_state(self.policy.model)

    def optimizer_state(self) -> dict:
        """``optimizer.state_dict()`` of a single process (sharded: a collective, rank 0's; {} elsewhere)."""
        if self.sharded:
            from ..fsdp import full_optimizer_state

            return full_optimizer_state(self.policy, self.optimizer)
        return self.optimizer.state_dict()

    def update(self, shards: list[list[Sample]], normalizers: list[float], n_samples: int,
               temperature: float) -> tuple[UpdateStats, int]:
        """Returns the update's statistics and the number of samples this rank trained on."""
        if self.sharded:
            from ..fsdp import sharded_epoch_update

            stats = sharded_epoch_update(self.policy, self.optimizer, shards, normalizers, n_samples,
                                         self.cfg.algo, temperature, self.reference)
            return stats, sum(len(s) for s in shards)
        allreduce = (lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM)) if self.world > 1 else None
        stats = epoch_update(self.policy, self.optimizer, shards, normalizers, n_samples, self.cfg.algo,
                                 temperature, self.reference, allreduce)
        return stats, sum(len(s) for s in shards)
