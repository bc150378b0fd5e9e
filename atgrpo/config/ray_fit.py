"""Where the Ray backend's workers go: the CPU shares of a local cluster, and whether the workers fit, checked
before any work starts (docs/ray.md)."""

from __future__ import annotations

import math
import os

from .schema import ConfigError, RayConfig


def validate_ray(r: RayConfig) -> None:
    """What ``check_fields`` cannot say: a cluster address, and CPU shares in Ray's resolution."""
    if r.address is not None and not (isinstance(r.address, str) and r.address):
        raise ConfigError(f"system.ray.address={r.address!r} must be a cluster address (e.g. auto) or null")
    for name, least in (("cpus_per_worker", RAY_MIN_FRACTION), ("cpus_per_env_worker", 0.0)):
        v = getattr(r, name)  # > 0 for pool workers: a placement-group bundle may not be empty
        if v is not None and not (v >= least and (v == 0 or v >= RAY_MIN_FRACTION)):
            raise ConfigError(f"system.ray.{name}={v!r} must be {'>' if least else '>='} 0 (Ray's smallest "
                              f"share is {RAY_MIN_FRACTION}), or null: share the local cluster's CPUs")


RAY_MIN_FRACTION = 0.0001  # Ray's resolution for fractional resources


def validate_pool_resources(r: RayConfig, policies: set[str]) -> None:
    """``system.ray.pool_resources``: policy -> {custom resource: amount > 0} per worker, for the run's policies,
    on an existing cluster (a local one started by atgrpo offers no custom resources)."""
    if not r.pool_resources:
        return
    if not r.address:
        raise ConfigError("system.ray.pool_resources places pools on nodes by their custom resources: it needs an "
                          "existing cluster (system.ray.address), whose nodes offer them (ray start --resources)")
    for pid, res in r.pool_resources.items():
        if pid not in policies:
            raise ConfigError(f"system.ray.pool_resources.{pid}: {pid!r} is not a policy of this run (policies: "
                              f"{', '.join(sorted(policies))})")
        ok = isinstance(res, dict) and res and all(
            isinstance(k, str) and k not in ("CPU", "GPU") and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v >= RAY_MIN_FRACTION for k, v in res.items())
        if not ok:
            raise ConfigError(f"system.ray.pool_resources.{pid}={res!r} must map custom resource names (not CPU or "
                              f"GPU: cpus_per_worker, gpus_per_worker) to amounts >= {RAY_MIN_FRACTION}, e.g. "
                              f"{{node_a: 0.01}}")


def local_ray_cpus(r: RayConfig) -> int:
    """The CPUs of the local Ray cluster atgrpo starts: ``system.ray.num_cpus``, else what Ray detects on this
    machine (cgroup limits included)."""
    if r.num_cpus is not None:
        return r.num_cpus
    try:
        from ray._private.utils import get_num_cpus  # what ray.init would offer by default

        return max(1, int(get_num_cpus()))
    except Exception:  # another Ray version: the plain count
        return os.cpu_count() or 1


def ray_cpu_shares(r: RayConfig, n_policies: int, cluster_cpus: float) -> tuple[float, float]:
    """(CPUs per rollout/update worker, CPUs per environment worker) on a cluster offering ``cluster_cpus``.

    A value left null shares what the set values leave free, equally among those workers (at most 1 CPU each,
    in Ray's steps of 0.0001). Raises ``ConfigError`` when the workers cannot all be placed."""
    n_pool = n_policies * (r.num_rollout_workers + r.num_update_workers)
    n_env = r.num_env_workers
    fixed = ((n_pool * r.cpus_per_worker if r.cpus_per_worker is not None else 0.0)
             + (n_env * r.cpus_per_env_worker if r.cpus_per_env_worker is not None else 0.0))
    n_auto = (n_pool if r.cpus_per_worker is None else 0) + (n_env if r.cpus_per_env_worker is None else 0)
    share = 1.0
    if n_auto:
        share = min(1.0, math.floor((cluster_cpus - fixed) / n_auto / RAY_MIN_FRACTION) * RAY_MIN_FRACTION)
        share = round(share, 4)
    per_worker = r.cpus_per_worker if r.cpus_per_worker is not None else share
    per_env = r.cpus_per_env_worker if r.cpus_per_env_worker is not None else share
    need = n_pool * per_worker + n_env * per_env
    set_ = [k for k in ("cpus_per_worker", "cpus_per_env_worker") if getattr(r, k) is not None]
    cpus = (f"system.ray.num_cpus={r.num_cpus}" if r.num_cpus is not None else
            "system.ray.num_cpus=null: this machine's CPUs")
    if n_auto and share < RAY_MIN_FRACTION:
        raise ConfigError(
            f"system.ray: {' and '.join(f'system.ray.{k}={getattr(r, k):g}' for k in set_)} take {fixed:g} of the "
            f"local Ray cluster's {cluster_cpus:g} CPUs ({cpus}), leaving nothing for the other {n_auto} workers; "
            f"lower it, or set system.ray.num_cpus={math.ceil(fixed) + 1}")
    if need > cluster_cpus + 1e-9:
        raise ConfigError(
            f"system.ray: the workers need {need:g} CPUs ({n_policies} {'policy' if n_policies == 1 else 'policies'}"
            f" x {r.num_rollout_workers + r.num_update_workers} workers x system.ray.cpus_per_worker="
            f"{per_worker:g} + {n_env} environment workers x system.ray.cpus_per_env_worker={per_env:g}) but the "
            f"local Ray cluster has {cluster_cpus:g} ({cpus}); "
            + (f"lower or unset {' / '.join('system.ray.' + k for k in set_)} (null shares the CPUs), " if set_
               else "use fewer workers, ")
            + f"or set system.ray.num_cpus={max(math.ceil(need), 1)} (logical CPUs: more than the cores "
              f"oversubscribes them)")
    return per_worker, per_env


def validate_ray_fit(r: RayConfig, n_policies: int) -> None:
    """Ray is installed and, for a local cluster, the workers fit in it: checked before any work."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("system.backend=ray needs Ray, which is not installed here: pip install -e '.[ray]'")
    if r.address:  # an existing cluster: Ray places the workers, or says why not, when they start
        return
    ray_cpu_shares(r, n_policies, local_ray_cpus(r))
    if r.gpus_per_worker > 0:
        import torch

        n_pool = n_policies * (r.num_rollout_workers + r.num_update_workers)
        need, have = n_pool * r.gpus_per_worker, torch.cuda.device_count() if torch.cuda.is_available() else 0
        if need > have + 1e-9:
            raise ConfigError(f"system.ray.gpus_per_worker={r.gpus_per_worker:g}: the {n_pool} rollout/update workers "
                              f"need {need:g} GPUs but this machine has {have}; lower it (fractions share a GPU), "
                              f"or 0 for CPU workers")


