"""The Ray backend's driver (``system.backend=ray``): the same train step as the local backend, its work placed
on actors (``workers.py``).

Placement (docs/ray.md):
- one resource pool (a placement group) per policy, holding its rollout worker(s) and update worker(s);
- a pool of CPU environment workers that step the K candidate clones of each node (and run sandboxed code);
- the driver runs ``step.train_step`` unchanged: it renders prompts, draws every random number from the run's
  generator (generator state travels with each ``generate`` call and comes back advanced), groups and computes
  advantages, routes each sample to its policy's pool by ``Sample.policy``, and keeps an up-to-date copy of
  every policy (for evaluation and checkpoints).

Per step: the rollout calls ``generate`` on the acting policy's rollout worker and ``step_envs`` on the
environment workers; ``update`` issues every policy's update on its update workers before waiting on any (the
policies train concurrently), then syncs each policy's trainable weights (for LoRA: the adapter) from its rank 0
to its rollout workers (through the object store) and to the driver, so the next rollout is on-policy.

With one rollout worker per policy the run draws the same random numbers as the local backend, so the rewards
are identical and the losses equal up to float summation order (tests/test_ray_backend.py). With several, each
rollout worker samples its share of the prompts from a seed drawn from the run's generator.

With ``system.ray.update_sharding=fsdp`` a policy's update workers hold FSDP2 shards of it (``workers.py``):
reading its weights or optimizer state is then a collective, so the driver calls it on every rank of the pool
(``_from_rank0``) and keeps rank 0's answer.

Faults: an environment worker that dies (``RayActorError``) is replaced and its work resubmitted, up to
``system.ray.env_retries`` times per task, then the step fails loudly. A dead rollout or update worker fails
the step with ``faults.WorkerLost`` naming it (every wait on a pool goes through ``faults.gather``); the run then
recovers (``trainer/recovery.py``: ``rebuild`` here, the last checkpoint restored, the steps since redone). Samples sent to update workers and samples trained are
counted; any difference is logged as ``ray/dropped_samples`` (and is 0 unless something is wrong).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ...rollout.records import Sample
from ...rollout.tree import step_clones
from .faults import gather
from .partition import split_even

if TYPE_CHECKING:  # this module's top level stays free of torch and ray: environment workers start in a second
    from ...config import Config
    from ..update import UpdateStats

READY_TIMEOUT_S = 300.0  # actors import torch and build a model: minutes on a loaded machine


@dataclass
class Pool:
    """One policy's resources: its placement group, rollout workers and update workers (rank order)."""
    pid: str
    pg: Any
    rollout: list = field(default_factory=list)
    update: list = field(default_factory=list)

    def rollout_names(self) -> list[str]:
        return [f"rollout worker {i} of policy {self.pid!r}" for i in range(len(self.rollout))]

    def update_names(self) -> list[str]:
        return [f"update worker {i} of policy {self.pid!r}" for i in range(len(self.update))]


def ray_shares(cfg: Config, n_policies: int, ray, owns_ray: bool) -> tuple[float, float]:
    """(CPUs per rollout/update worker, CPUs per environment worker) of a run with ``n_policies`` policies.

    On an existing cluster (``system.ray.address``) an unset share is 1 CPU. Otherwise the unset shares divide
    the CPUs this run may use: the whole local cluster it started, or what is free on a Ray instance already
    running in this process (``config.ray_cpu_shares``, which raises ``ConfigError`` when they cannot fit)."""
    from ...config import ray_cpu_shares

    r = cfg.system.ray
    if r.address:
        return (r.cpus_per_worker if r.cpus_per_worker is not None else 1.0,
                r.cpus_per_env_worker if r.cpus_per_env_worker is not None else 1.0)
    res = ray.cluster_resources() if owns_ray else ray.available_resources()
    return ray_cpu_shares(r, n_policies, float(res.get("CPU", 0.0)))


def ray_note(cfg: Config, n_policies: int, cluster_cpus: float) -> str | None:
    """The line that says how a local cluster's CPUs are shared when atgrpo chose the shares, else None."""
    from ...config import ray_cpu_shares

    r = cfg.system.ray
    if r.address or (r.cpus_per_worker is not None and r.cpus_per_env_worker is not None):
        return None
    w, e = ray_cpu_shares(r, n_policies, cluster_cpus)
    n_pool = n_policies * (r.num_rollout_workers + r.num_update_workers)
    return (f"atgrpo: Ray: {n_pool + r.num_env_workers} workers share the local cluster's {cluster_cpus:g} CPUs: "
            f"{w:g} CPU per rollout/update worker, {e:g} per environment worker (set system.ray.cpus_per_worker / "
            f"cpus_per_env_worker to choose; system.ray.num_cpus for more logical CPUs)")


def _plain(resources: dict) -> dict:
    """CPU / GPU of a Ray resource dict, without the per-placement-group entries."""
    return {k: v for k, v in resources.items() if k in ("CPU", "GPU")}


class EnvWorker:
    """Steps the candidate clones of environments (and so runs their sandboxed code) off the driver: the
    local backend's ``step_clones`` in another process. (A plain class: ``RayBackend`` makes it an actor.)"""

    def ready(self) -> int:
        return os.getpid()

    def step(self, envs, texts):
        return step_clones(envs, texts)


class RayBackend:
    """Rollout, update and environment workers on Ray. Joins the running Ray instance if there is one
    (``ray.init`` already called), else connects to ``system.ray.address`` or starts a local cluster."""

    def __init__(self, cfg: Config):
        import ray

        from ...config import local_ray_cpus
        from ...config.checks import route_agents
        from ..setup import env_factory

        self.cfg, r = cfg, cfg.system.ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if r.address:
                ray.init(address=r.address)
            else:  # the CPU count the config was checked against (config.local_ray_cpus)
                ray.init(num_cpus=local_ray_cpus(r), include_dashboard=False)
        self.policy_ids = sorted(set(route_agents(cfg, env_factory(cfg)("train", 0).agents).values()))
        try:  # shares of the CPUs this run may use: a local cluster never grows, so a misfit is said now
            self.cpus_per_worker, self.cpus_per_env_worker = ray_shares(cfg, len(self.policy_ids), ray,
                                                                         self._owns_ray)
        except BaseException:
            if self._owns_ray:
                ray.shutdown()
            raise
        self._env_actor = ray.remote(EnvWorker)
        self._make_workers()
        self.counters: dict[str, float] = {}
        self._reset_counters()

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def _make_workers(self) -> None:
        """Every policy's pool (a placement group with ``system.ray.placement``'s strategy, its bundles holding
        ``pool_resources``' custom resources) and the environment workers; they start in the background."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from . import workers as rw

        cfg, r = self.cfg, self.cfg.system.ray
        self.pools: dict[str, Pool] = {}
        for pid in self.policy_ids:
            extra = dict(r.pool_resources.get(pid, {}))
            bundle = {"CPU": self.cpus_per_worker, **({"GPU": r.gpus_per_worker} if r.gpus_per_worker > 0 else {}),
                      **extra}
            pg = placement_group([dict(bundle)] * (r.num_rollout_workers + r.num_update_workers),
                                 strategy=r.placement.upper())
            pool = self.pools[pid] = Pool(pid, pg)
            for i in range(r.num_rollout_workers + r.num_update_workers):
                opts = dict(num_cpus=self.cpus_per_worker, num_gpus=r.gpus_per_worker, resources=extra,
                            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
                if i < r.num_rollout_workers:
                    pool.rollout.append(rw.RolloutWorker.options(**opts).remote(cfg, pid, self.policy_ids))
                else:
                    rank = i - r.num_rollout_workers
                    pool.update.append(rw.UpdateWorker.options(**opts).remote(
                        cfg, pid, self.policy_ids, rank, r.num_update_workers))
        self.env_workers = [self._new_env_worker() for _ in range(r.num_env_workers)]
        self._state = None  # the TrainState whose weights the workers hold
        self._started = False

    def _release_workers(self) -> None:
        """Kill every worker (dead ones too: killing is idempotent) and remove the placement groups."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in [w for p in self.pools.values() for w in p.rollout + p.update] + self.env_workers:
            ray.kill(w)
        for pool in self.pools.values():
            remove_placement_group(pool.pg)
        self.pools, self.env_workers = {}, []

    def rebuild(self) -> None:
        """After a lost worker or node: every pool and environment worker anew, on what the cluster still has,
        started (placed, ready, process groups formed); they receive the driver's state at the next step."""
        self._release_workers()
        self._make_workers()
        self._start()

    def _new_env_worker(self):
        return self._env_actor.options(num_cpus=self.cpus_per_env_worker).remote()

    def _start(self) -> None:
        """Wait until every placement group and actor is up; form each policy's process group."""
        import ray

        for pid, pool in self.pools.items():
            if not pool.pg.wait(timeout_seconds=READY_TIMEOUT_S):
                r = self.cfg.system.ray
                n = r.num_rollout_workers + r.num_update_workers
                raise RuntimeError(
                    f"Ray could not place policy {pid!r} in {READY_TIMEOUT_S:.0f}s: its pool needs {n} bundles of "
                    f"{self.cpus_per_worker:g} CPU / {r.gpus_per_worker:g} GPU; the cluster has "
                    f"{_plain(ray.cluster_resources())} in all, {_plain(ray.available_resources())} free. Lower "
                    f"system.ray.cpus_per_worker or the worker counts, or add resources (system.ray.num_cpus "
                    f"for a local cluster)")
        pools = list(self.pools.values())
        gather([w.ready.remote() for p in pools for w in p.rollout + p.update],
               [n for p in pools for n in p.rollout_names() + p.update_names()])
        ray.get([w.ready.remote() for w in self.env_workers], timeout=READY_TIMEOUT_S)
        groups, names = [], []
        for pool in pools:
            addr, port = gather([pool.update[0].rendezvous.remote()], pool.update_names()[:1])[0]
            groups += [w.init_group.remote(addr, port) for w in pool.update]
            names += pool.update_names()
        gather(groups, names)
        self._started = True

    def attach(self, state) -> None:
        """Give every worker the driver's weights, optimizer states and KL references (at the first step, or
        after the driver changed them: warm start, resume, a new TrainState)."""
        import ray

        from .workers import trainable_state

        if not self._started:
            self._start()
        t, refs, names = time.perf_counter(), [], []
        for pid, pool in self.pools.items():
            w = ray.put(trainable_state(state.policies[pid].model))
            opt = ray.put(state.optimizers[pid].state_dict())
            ref = state.references.get(pid)
            ref = ray.put(trainable_state(ref.model)) if ref is not None else None
            refs += [u.load.remote(w, opt, ref) for u in pool.update] + [r.load.remote(w) for r in pool.rollout]
            names += pool.update_names() + pool.rollout_names()
        gather(refs, names)
        self._state = state
        self.counters["time/ray_attach"] += time.perf_counter() - t

    def close(self) -> None:
        import ray

        self._release_workers()
        if self._owns_ray:
            ray.shutdown()

    # ---- the train step's three calls ---------------------------------------------------------------------
    def eval_policies(self, state) -> dict:  # evaluation runs on the driver's copies
        return state.policies

    def rollout_policies(self, state) -> dict:
        """The driver's policies with ``generate`` on their rollout workers (``workers.RemotePolicy``)."""
        from .workers import RemotePolicy

        if self._state is not state:
            self.attach(state)
        return {pid: RemotePolicy(state.policies[pid], self.pools[pid].rollout, self.pools[pid].rollout_names())
                for pid in self.policy_ids}

    def step_envs(self, envs: Sequence, texts: Sequence[Sequence[str]]) -> list:
        """``rollout.tree.step_clones`` on the environment workers, one contiguous share of the problems each;
        a share whose worker died is resubmitted to a fresh worker."""
        import ray
        from ray.exceptions import RayActorError

        shares = [s for s in split_even(list(range(len(envs))), len(self.env_workers)) if s]
        out: list = [None] * len(envs)
        pending: dict = {}

        def submit(j: int, attempt: int) -> None:
            worker = self.env_workers[j]
            ref = worker.step.remote([envs[i] for i in shares[j]], [texts[i] for i in shares[j]])
            pending[ref] = (j, attempt, worker)

        for j in range(len(shares)):
            submit(j, 0)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            j, attempt, worker = pending.pop(ready[0])
            try:
                results = ray.get(ready[0])
            except RayActorError as e:
                if self.env_workers[j] is worker:  # replace it (once, however many of its tasks failed)
                    ray.kill(worker)
                    self.env_workers[j] = self._new_env_worker()
                    self.counters["ray/env_worker_restarts"] += 1
                if attempt >= self.cfg.system.ray.env_retries:
                    raise RuntimeError(f"environment work failed {attempt + 1} times (its worker died each time); "
                                       f"system.ray.env_retries={self.cfg.system.ray.env_retries}") from e
                self.counters["ray/env_retries"] += 1
                submit(j, attempt + 1)
                continue
            for i, res in zip(shares[j], results):
                out[i] = res
        return out

    def update(self, state, batches: dict[str, list[Sample]]) -> dict[str, UpdateStats]:
        """Every policy's update on its own update workers, concurrently; then weight sync."""
        from ..update import UpdateStats, plan_minibatches

        algo, temp = self.cfg.algo, self.cfg.rollout.temperature
        calls, sent, stats = {}, {}, {}
        for pid, batch in batches.items():  # issue all, in policy order (the generator's order), then wait
            if not batch:
                stats[pid] = UpdateStats()
                continue
            workers = self.pools[pid].update  # the plan (and random draw) of update_policy, sharded over ranks
            plan = plan_minibatches(batch, algo, state.generator, world=len(workers))
            calls[pid] = [w.update.remote(plan.shards[rank], plan.normalizers, plan.n_samples, temp)
                          for rank, w in enumerate(workers)]
            sent[pid] = len(batch)
        for pid, refs in calls.items():
            outs = gather(refs, self.pools[pid].update_names())
            steps = {o[0].optimizer_steps for o in outs}
            assert len(steps) == 1, f"policy {pid}: update ranks disagree on optimizer steps {steps}"
            stats[pid] = outs[0][0]
            self.counters["ray/dropped_samples"] += sent[pid] - sum(o[1] for o in outs)
        self._sync_weights(state, list(calls))
        return stats

    def _from_rank0(self, pool: Pool, method: str):
        """The object ref of rank 0's ``method()``, once every rank's call has succeeded; with sharded update
        workers the call is a collective, so every rank makes it (the others return {})."""
        r = self.cfg.system.ray
        ranks = pool.update if r.update_sharding == "fsdp" and len(pool.update) > 1 else pool.update[:1]
        refs = [getattr(w, method).remote() for w in ranks]
        gather(refs, pool.update_names()[:len(refs)])
        return refs[0]

    def _sync_weights(self, state, pids: list[str]) -> None:
        """Rank 0's trainable weights to the policy's rollout workers (one object-store copy) and the driver."""
        import ray

        from .workers import load_trainable

        t = time.perf_counter()
        wrefs = {pid: self._from_rank0(self.pools[pid], "weights") for pid in pids}
        loads = [r.load.remote(wrefs[pid]) for pid in pids for r in self.pools[pid].rollout]
        for pid in pids:
            load_trainable(state.policies[pid].model, ray.get(wrefs[pid]))
        gather(loads, [n for pid in pids for n in self.pools[pid].rollout_names()])
        self.counters["time/ray_sync"] += time.perf_counter() - t

    def pull_state(self, state) -> None:
        """Bring the optimizer states to the driver (for a checkpoint; the weights are there after each step)."""
        import ray

        if self._state is not state:
            return  # the workers hold nothing newer than the driver
        opts = ray.get([self._from_rank0(p, "optimizer_state") for p in self.pools.values()])
        for pid, opt in zip(self.pools, opts):
            state.optimizers[pid].load_state_dict(opt)

    def step_metrics(self) -> dict[str, float]:
        out = dict(self.counters)
        self._reset_counters()
        return out

    def _reset_counters(self) -> None:
        self.counters = {k: 0.0 for k in ("ray/dropped_samples", "ray/env_retries", "ray/env_worker_restarts",
                                          "time/ray_sync", "time/ray_attach")}
