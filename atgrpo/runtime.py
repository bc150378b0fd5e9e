"""Process settings for training on CPUs: keep freed memory in the process instead of returning it to the OS.

glibc's ``malloc`` serves blocks above a (dynamic) threshold with ``mmap`` and gives them back with ``munmap``
when freed, and trims the top of the heap once more than 128 KiB there is free. A training step frees and
re-allocates the same activation-sized blocks every forward and backward, so each step the kernel hands out,
and zeroes, fresh pages again; on the 2-core test machine page faults showed up as much of the system time of
a step. ``keep_freed_memory`` raises both thresholds (``mallopt``), so freed blocks stay in the process for the
next step: the quickstart ran 79 s -> 73 s with the same peak memory (see docs/performance.md for the
commands). This is what PyTorch's CPU tuning guide gets by switching to jemalloc or tcmalloc, without a new
dependency. Blocks above ``mmap_threshold`` (big tensors, where a page fault is cheap next to the work on
them) still come from ``mmap``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
_applied: tuple[int, int] | None = None


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Set glibc's mmap and trim thresholds (bytes) for this process. Returns False where the C library has
    no ``mallopt`` (macOS, musl) or refuses a value; then nothing changed. Idempotent."""
    global _applied
    for name, v in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if not 0 <= v < 2**31:
            raise ValueError(f"{name}={v}: mallopt takes a C int of bytes, 0 to 2**31 - 1")
    if _applied == (mmap_threshold, trim_threshold):
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, mmap_threshold) != 1 or mallopt(_M_TRIM_THRESHOLD, trim_threshold) != 1:
        return False
    _applied = (mmap_threshold, trim_threshold)
    return True


def malloc_settings() -> dict | None:
    """The thresholds ``keep_freed_memory`` set in this process (None: the C library's defaults)."""
    return None if _applied is None else {"mmap_threshold": _applied[0], "trim_threshold": _applied[1]}
