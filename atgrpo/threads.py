"""How many CPU threads torch gets: ``train.threads``, else ``OMP_NUM_THREADS``, else the cores that are free now.

torch's own default is one thread per core, whether or not other processes use them. On a shared machine that
oversubscribes the cores: a quickstart step measured 2-3 s alone went to 70-80 s with three other torch jobs
running. The default here counts the cores this process may use (CPU affinity and a cgroup CPU quota) and
subtracts the 1-minute load average (the other runnable processes), keeping at least one. No torch import.
"""

from __future__ import annotations

import math
import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 / v1 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota() -> float | None:
    """CPUs allowed by the cgroup quota (cpu.max, or cfs_quota_us / cfs_period_us), None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def free_threads(cores: int, load: float | None) -> int:
    """The cores left by ``load`` runnable processes (rounded to the nearest core), at least 1."""
    if load is None:
        return cores
    return max(1, min(cores, int(math.floor(cores - load + 0.5))))


def choose_threads(requested: int) -> tuple[int, str]:
    """(threads, why): ``requested`` (train.threads) when > 0, else ``OMP_NUM_THREADS`` when set, else the free
    cores. ``why`` is a short reason for the start-up line."""
    if requested > 0:
        return requested, "train.threads"
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    cores, load = usable_cores(), _load_average()
    n = free_threads(cores, load)
    load_text = "unknown" if load is None else f"{load:.1f}"
    return n, f"free cores: {cores} usable, load average {load_text}"
