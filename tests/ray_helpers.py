"""What the Ray backend's test modules share: a module's backend on a fresh local 2-CPU Ray instance, and the
comparison of a Ray step's metrics with the local backend's. Imported after ``pytest.importorskip("ray")``."""

import ray

from atgrpo.config import load_config
from atgrpo.trainer.ray.driver import RayBackend

# 2 CPUs hold a module's backend and a run's actors at 1/8 CPU each
RAY = ["warmstart.enabled=false", "system.backend=ray", "system.ray.cpus_per_worker=0.125",
       "system.ray.cpus_per_env_worker=0.125"]
# Losses, KL and grad norms: data-parallel ranks sum gradients in another order than one process does. The loss is
# a sum of terms of both signs (advantages are zero-mean per group), so the tolerance is relative or absolute.
REL, ABS = 1e-4, 1e-6
CLOSE = ("loss", "pg", "clipfrac", "approx_kl", "grad_norm")


def module_backend(items: list[str]):
    """For a module-scoped fixture (``yield from module_backend(ITEMS)``): Ray started, the backend of the config
    ``items`` yielded, then closed and Ray shut down."""
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    be = RayBackend(load_config(None, items))
    yield be
    be.close()
    ray.shutdown()


def compare_metrics(local: dict, remote: dict) -> None:
    """A Ray step's metrics against the local backend's: timings aside, losses and statistics within float
    summation order, everything else (rewards, success, groups, sample counts) exact."""
    assert set(local) <= set(remote)
    for k, a in local.items():
        if k.startswith(("time/", "perf/")):
            continue
        b = remote[k]
        if k.split("/")[-1] in CLOSE or k.startswith("adv/"):
            assert abs(a - b) <= ABS + REL * abs(a), (k, a, b)
        else:
            assert a == b, (k, a, b)  # rewards, success, groups, sample counts: exact
