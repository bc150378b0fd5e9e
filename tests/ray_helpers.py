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


# ---- faults injected into real runs ------------------------------------------------------------------------
from fault_helpers import NOT_COMPARED, before_step, run_rows  # noqa: E402,F401  (shared with non-Ray tests)


def die_in_forward(training: bool, flag: str | None = None, hold_s: float = 0.0):
    """For ``actor.__ray_call__``: the worker's next forward pass through its output layer with gradients
    (``training``: mid-update) or without (mid-rollout) SIGKILLs the worker's process, as an OOM kill would; with
    ``flag``, it instead creates that file and holds for ``hold_s`` seconds (something else kills it: its node)."""
    def install(worker):
        import os
        import signal
        import time

        import torch

        def hook(module, inputs, output):
            if torch.is_grad_enabled() == training:
                if flag is None:
                    os.kill(os.getpid(), signal.SIGKILL)
                open(flag, "w").close()
                time.sleep(hold_s)
            return output
        worker.policy.model.get_output_embeddings().register_forward_hook(hook)
        return os.getpid()
    return install


def kill_worker(backend, policy: str, kind: str, index: int, **how) -> int:
    """Arm ``die_in_forward`` in one worker of a running Ray backend (``kind``: rollout | update); its pid."""
    pool = backend.pools[policy]
    worker = (pool.rollout if kind == "rollout" else pool.update)[index]
    return ray.get(worker.__ray_call__.remote(die_in_forward(kind == "update", **how)))


ray.cloudpickle.register_pickle_by_value(__import__(__name__))
