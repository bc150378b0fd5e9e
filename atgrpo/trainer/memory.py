"""Peak resident memory per phase of a run (warm start, rollout, update, evaluation), on Linux.

The kernel keeps each process's high-water mark of resident memory (``VmHWM`` in ``/proc/self/status``) and
resets it when ``5`` is written to ``/proc/self/clear_refs``. ``phase(name, peaks)`` resets it when the phase
starts and reads it when the phase ends, so ``peaks[name]`` is that phase's own peak in MiB (the highest over
repeated phases). The process-wide peak since ``reset_peak_rss`` survives these resets (``peak_rss_gb``), so a
benchmark that measures a whole run around phases still gets the whole run's peak. Off Linux nothing is
measured: ``phase`` records nothing and ``peak_rss_gb`` is None.

After each phase, and after each optimizer step of the warm start and of the update, the C allocator's freed
memory goes back to the system (``release_free_memory``: glibc's ``malloc_trim``), so the next batch starts from
the live tensors rather than from the holes the last one left. Within a batch the same happens after a
micro-batch's backward once glibc holds more than ``MICRO_BATCH_TRIM_MIB`` free (``mallinfo2``): the holes of one
micro-batch's activations are not reused whole by the next, and on the Plan-Path cell they had added up to ~0.6
GiB by the end of a batch of four micro-batches (warm-start peak 4.49 -> 3.93 GiB, its time unchanged:
``python benchmarks/warmstart_peak.py``). A trim after every micro-batch, whatever it frees, cost ~9 % of the
warm start's time: the pages it returns fault in again. ``import atgrpo`` also turns on torch's
transparent-huge-page allocation (``THP_MEM_ALLOC_ENABLE=1`` unless set: blocks of 2 MiB and more page-aligned and
advised as huge pages), which on the Plan-Path cell lowered the warm start's peak by ~0.5 GiB and its time by a
tenth (``docs/performance.md``). glibc keeps freed blocks for reuse, and after the first large free it serves
blocks up to 32 MiB from its heap instead of ``mmap``, so the activations of a warm start or an update stayed
resident for the rest of the run (SmolLM2 on Plan-Path: 7.0 GiB resident after the warm start with 1.0 GiB of
live tensors, 1.5 GiB after the trim).

These are this process's peaks: on the Ray backend the rollout and update run in workers, whose memory is their
own (``ray/*`` metrics).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

_before_reset_kb = 0  # the highest VmHWM read before a phase's reset, since the last ``reset_peak_rss``


def _hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


def _clear() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def reset_peak_rss() -> None:
    """Start this process's peak-RSS count afresh (a benchmark cell's peak is its own)."""
    global _before_reset_kb
    _before_reset_kb = 0
    _clear()


def peak_rss_mib() -> float | None:
    """This process's peak resident memory in MiB since it started or since the last ``reset_peak_rss``, across
    the phases' resets; None off Linux. (Tools that read the kernel's count alone, such as ``/usr/bin/time``'s
    maximum resident set size, see only the peak since the last phase began.)"""
    kb = _hwm_kb()
    return None if kb is None else max(kb, _before_reset_kb) / 1024


def peak_rss_gb() -> float | None:
    """``peak_rss_mib`` in GB (GiB), rounded to 0.01."""
    mib = peak_rss_mib()
    return None if mib is None else round(mib / 1024, 2)


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()  # None off glibc (macOS, musl): nothing to trim
MICRO_BATCH_TRIM_MIB = 256  # after a micro-batch's backward: trim once the allocator holds this much free


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    fn = getattr(_LIBC, "mallinfo2", None)  # glibc 2.33 and later
    if fn is not None:
        fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()


def free_held_mib() -> float | None:
    """The free memory the C allocator holds in its heaps (glibc ``mallinfo2().fordblks``: free blocks and the
    heaps' unused tops), MiB; None where it cannot say. It counts free blocks whose pages an earlier trim already
    returned, so it says how much the heaps have grown beyond the live blocks, not how much is resident: once a
    run's heaps have grown past ``MICRO_BATCH_TRIM_MIB``, every micro-batch is followed by a trim."""
    return None if _MALLINFO2 is None else _MALLINFO2().fordblks / 2**20


def release_free_memory(above_mib: float = 0.0) -> None:
    """Return the C allocator's free memory to the system (glibc ``malloc_trim(0)``; elsewhere nothing); with
    ``above_mib``, only when it holds more than that much free (``free_held_mib``; always where that is unknown).
    A trim is not free: the pages it returns fault in again when the memory is used next."""
    if _LIBC is None:
        return
    held = free_held_mib() if above_mib > 0 else None
    if held is None or held > above_mib:
        _LIBC.malloc_trim(0)


@contextlib.contextmanager
def phase(name: str, peaks: dict[str, float]) -> Iterator[None]:
    """Record the enclosed phase's peak resident memory in ``peaks[name]`` (MiB; the larger of this and any
    value already there), then release the allocator's free memory."""
    global _before_reset_kb
    kb = _hwm_kb()
    if kb is not None:
        _before_reset_kb = max(_before_reset_kb, kb)
        _clear()
    try:
        yield
    finally:
        if kb is not None:
            kb = _hwm_kb() or 0
            _before_reset_kb = max(_before_reset_kb, kb)
            peaks[name] = max(peaks.get(name, 0.0), kb / 1024)
        release_free_memory()


def saved_tensor_bytes(output: "torch.Tensor") -> dict[tuple[str, str], int]:
    """What autograd keeps for the backward of ``output``: bytes of every distinct storage its graph saved, by
    (node type, dtype), parameters left out (they are the model's). A diagnostic (``benchmarks/kept_bytes.py``,
    ``tests/test_lean_layers.py``)."""
    import torch

    seen: dict[int, tuple[tuple[str, str], int]] = {}
    params: set[int] = set()
    stack, visited = [output.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited:
            continue
        visited.add(fn)
        name = type(fn).__name__
        if name == "AccumulateGrad":
            params.add(fn.variable.untyped_storage().data_ptr())
        tensors = []
        for attr in dir(fn):
            if attr.startswith("_saved_") or attr == "saved_tensors":
                try:
                    value = getattr(fn, attr)
                except RuntimeError:  # freed already, or not a tensor attribute
                    continue
                items = value if isinstance(value, (tuple, list)) else [value]
                tensors += [t for t in items if isinstance(t, torch.Tensor)]
        for t in tensors:
            storage = t.untyped_storage()
            seen.setdefault(storage.data_ptr(), ((name, str(t.dtype).removeprefix("torch.")), storage.nbytes()))
        stack += [nxt for nxt, _ in fn.next_functions]
    out: dict[tuple[str, str], int] = {}
    for ptr, (key, nbytes) in seen.items():
        if ptr not in params:
            out[key] = out.get(key, 0) + nbytes
    return out
