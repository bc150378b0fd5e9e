"""Several Ray nodes simulated on one machine (``ray.cluster_utils.Cluster``): a head and two worker nodes, each
with its own CPU count and custom resource. Pools are placed across them (``system.ray.pool_resources`` pins a
policy's pool to the nodes offering a resource; ``system.ray.placement=spread`` spreads a pool over the nodes),
and the steps equal the local backend's. A node removed mid-update (its raylet and every process on it killed)
is recovered from: the run rebuilds its pools on the nodes left and writes exactly an undisturbed run's rows.

What this cannot show: a real network (every node is on 127.0.0.1: no latency, no partitions) and GPUs.
"""

import os
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from atgrpo.config import load_config  # noqa: E402
from atgrpo.trainer.ray.driver import RayBackend  # noqa: E402
from atgrpo.trainer.run import train  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from atgrpo.trainer.step import train_step  # noqa: E402

from conftest import FAST  # noqa: E402
from ray_helpers import RAY, before_step, compare_metrics, kill_worker, run_rows  # noqa: E402

# a node that leaves is declared dead after ~2 s of missed health checks (Ray's default: tens of seconds)
FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head": 1},
                                                      "include_dashboard": False, "_system_config": FAST_HEALTH})
    try:
        nodes = {"head": c.head_node, "node_a": c.add_node(num_cpus=1, resources={"node_a": 1}),
                 "node_b": c.add_node(num_cpus=2, resources={"node_b": 1})}
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def _node_of(worker) -> str:
    return ray.get(worker.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def test_pools_pinned_to_nodes_match_the_local_backend(cluster):
    """Two per-role policies (L3), each pinned to its own node by a custom resource: two steps equal the local
    backend's (same seed: identical rewards, losses up to float summation order)."""
    c, nodes = cluster
    items = FAST + RAY + ["policy.sharing=L3", "system.ray.num_env_workers=1", f"system.ray.address={c.address}",
                          "system.ray.pool_resources={plan: {node_a: 0.01}, tool: {node_b: 0.01}}"]
    cfg = load_config(None, items)
    backend = RayBackend(cfg)
    try:
        local, remote = build_state(cfg), build_state(cfg)
        remote.backend = backend
        for step in (1, 2):
            compare_metrics(train_step(local, step).metrics(), train_step(remote, step).metrics())
        for pid, node in (("plan", "node_a"), ("tool", "node_b")):
            pool = backend.pools[pid]
            assert {_node_of(w) for w in pool.rollout + pool.update} == {nodes[node].node_id}, pid
    finally:
        backend.close()


# L1 over the three nodes: 1 rollout + 2 update workers, spread; a checkpoint every 2 of 4 steps
SPREAD = FAST + RAY + ["train.steps=4", "train.checkpoint_every=2", "eval.problems=2", "system.ray.num_env_workers=1",
                       "system.ray.num_update_workers=2", "system.ray.placement=spread"]


@pytest.mark.slow
def test_a_node_removed_mid_update_is_recovered_on_the_nodes_left(cluster, tmp_path, monkeypatch):
    c, nodes = cluster
    items = SPREAD + [f"system.ray.address={c.address}"]
    ref = str(tmp_path / "undisturbed")
    train(load_config(None, items), ref, progress=False)
    flag, removed = str(tmp_path / "in-update"), []

    def remove_when_updating(node):
        deadline = time.time() + 300
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.05)
        c.remove_node(node, allow_graceful=False)  # its raylet and every worker on it: gone mid-update
        removed.append(node)

    def arm(state):  # an update worker on a worker node holds in its forward until its node is removed
        pool = state.backend.pools["shared"]
        where = {_node_of(w): i for i, w in enumerate(pool.update)}
        assert len({_node_of(w) for w in pool.rollout + pool.update}) >= 2, "spread put the pool on one node"
        name, rank = next((n, where[nodes[n].node_id]) for n in ("node_a", "node_b") if nodes[n].node_id in where)
        kill_worker(state.backend, "shared", "update", rank, flag=flag, hold_s=600)
        threading.Thread(target=remove_when_updating, args=(nodes[name],), daemon=True).start()
    before_step(monkeypatch, 4, arm)
    out = str(tmp_path / "run")
    summary = train(load_config(None, items), out, progress=False)
    assert removed, "no node was removed"
    [rec] = summary["recoveries"]
    assert (rec["failed_step"], rec["restored_step"]) == (4, 2) and "update worker" in rec["worker"], rec
    assert run_rows(out) == run_rows(ref)


def test_config_of_placement_and_recovery():
    from atgrpo.config import ConfigError

    r = load_config(None, []).system.ray
    assert (r.max_failures, r.placement, r.pool_resources) == (3, "pack", {})
    for items, message in [
        (["system.ray.max_failures=-1"], "system.ray.max_failures=-1 must be an integer >= 0"),
        (["system.ray.placement=strict"], "system.ray.placement='strict' is not valid; choose one of: pack, spread"),
        (["system.ray.pool_resources={shared: {node_a: 1}}"], "needs an existing cluster (system.ray.address)"),
        (["system.ray.address=auto", "system.ray.pool_resources={plan: {node_a: 1}}"],
         "'plan' is not a policy of this run (policies: shared)"),
        (["system.ray.address=auto", "system.ray.pool_resources={shared: {CPU: 1}}"], "not CPU or GPU"),
        (["system.ray.address=auto", "system.ray.pool_resources={shared: {node_a: 0}}"], "amounts >= 0.0001"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, items)
        assert message in str(e.value), (items, str(e.value))
