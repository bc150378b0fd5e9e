"""Run untrusted Python code (written by LLM agents during RL training) in a confined process.

``run_python(code, stdin, timeout, limits)`` executes ``code`` as ``python -I main.py`` in a fresh
sandbox and returns an :class:`ExecResult`.  It never raises because of what the program does (syntax
errors, exceptions, ``sys.exit``, crashes, signals, floods of output); it raises only when the sandbox
cannot be set up, or (:class:`SandboxUnavailable`) when nothing on this machine can confine the program
and unconfined runs were not allowed.  :class:`SandboxPool` / :func:`run_many` run many programs on a
thread pool.  In RL the boundary matters: a policy that can read a dataset's answers or the tests earns
full reward without solving anything.

What is isolated
    * A minimal root per run (``root.py``): the process moves (``pivot_root``) into a fresh tmpfs holding only
      the interpreter (the real binary behind ``sys.executable``: no virtual environment), its standard
      library, the shared libraries they load, ``/bin/sh``, ``/etc/ld.so.cache`` and five ``/dev`` nodes,
      all read-only; the packages a run declares (``Limits.packages``, none by default), read-only; a
      private ``/tmp`` (tmpfs of ``Limits.file_size_mb``, 16384 inodes) holding the working directory
      (``/tmp/atgrpo-sbx-<random>``, also ``HOME``) with ``main.py``; a fresh ``/proc``.  No other file of
      the machine exists there: not the dataset files (HumanEval's data, a JSONL passed to an
      environment), the run directory, the repository, atgrpo itself, any home directory, site-packages
      or ``/etc/passwd``.  Everything the program writes is gone when the run ends.
    * Its own PID namespace: ``/proc`` lists only the sandbox's processes.  Pid 1 is ``/bin/sh``
      *exec'd* by the forked child (``INIT_SCRIPT``), so its command line and environment are the
      sandbox's, never the trainer's; it runs the program and exits with its status; the kernel then
      kills whatever is left in the namespace (``setsid`` and double-fork escapes included).
    * No descriptor beyond stdin, stdout and stderr.  A scrubbed environment: ``PATH``, ``LANG``,
      ``HOME``, ``MALLOC_ARENA_MAX`` (so that threads fit under the address-space limit).
    * A system-call filter (``seccomp.py``: classic BPF via ``prctl``, no libseccomp; x86_64 and
      aarch64): ptrace, process_vm_*, mount and the new mount API, umount, pivot_root, chroot, unshare,
      setns, clone with a namespace flag, keyctl, bpf, perf_event_open, userfaultfd, io_uring, module
      loading, kexec, reboot, swap, the clocks, the host name, ... fail with EPERM (the program's stderr
      shows ``PermissionError: [Errno 1] Operation not permitted``); another ABI kills the process.
      ``no_new_privs`` is set.
    * ``setrlimit``: CPU seconds, address space, file size, processes (``RLIMIT_NPROC``), no core dumps.
      Output is read incrementally and capped per stream; a program that keeps writing far past the cap
      is killed.  On timeout the namespace's init is SIGKILLed (``pidfd``), which takes the whole
      namespace down; the same kill always happens after a run.  If our own process is SIGKILLed, the
      sandbox dies with it (parent-death signal).
    * A private network namespace (only a down loopback) unless ``Limits.network``.
    * As root (CAP_SYS_ADMIN), the program runs as an unprivileged uid unique to the run
      (``UID_BASE + 64 * pid + slot``, in no group), so ``RLIMIT_NPROC`` is not shared.  As another user,
      the same confinement comes from an unprivileged user namespace (the user's own uid mapped to
      itself; needs ``kernel.unprivileged_userns_clone=1`` / ``user.max_user_namespaces > 0`` and no
      AppArmor restriction); the program keeps that uid but sees nothing of the user's files.
    * Where neither works (no namespaces: e.g. a default Docker container), :func:`run_python` refuses
      with one line naming ``sandbox.unconfined: true`` (config) / ``ATGRPO_SANDBOX_UNCONFINED=1``, which
      runs programs unconfined: resource limits, the filter and the scrubbed environment only, in a host
      directory; a training run that sets it says so at start-up.

What is NOT isolated
    The kernel is shared (a kernel exploit wins; the filter only narrows the surface).  ``/proc`` and the
    bound standard library and shared libraries are readable: kernel-wide facts (``/proc/cpuinfo``,
    ``/proc/meminfo``) and the interpreter's own files, none of them the user's.  Memory is limited by
    address space per process, not cgroups; CPU by ``RLIMIT_CPU`` per process.  The init is ``/bin/sh``,
    which reports a signal as 128 + n: a program that exits with 129..192 itself reads as killed by a
    signal.  The pre-exec hook forks from the (possibly multi-threaded) caller and runs only plain
    syscalls via ``os``/``ctypes`` before exec.

Network isolation
    ``NETWORK_ISOLATION`` (module attribute, probed lazily on first access) says whether programs get an
    empty network namespace; see also :func:`isolation`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from .confine import Isolation, leftover_processes
from .runner import ExecResult, Limits, _run, isolation

__all__ = ["ExecResult", "Isolation", "Limits", "SandboxPool", "SandboxUnavailable", "allow_unconfined",
           "isolation", "leftover_processes", "run_many", "run_python", "NETWORK_ISOLATION"]

UNCONFINED_ENV = "ATGRPO_SANDBOX_UNCONFINED"  # "1": what ``sandbox.unconfined: true`` sets for every process


class SandboxUnavailable(RuntimeError):
    """Nothing on this machine can confine programs, and running them unconfined was not allowed."""


def __getattr__(name: str):  # PEP 562: NETWORK_ISOLATION is probed on first access
    if name == "NETWORK_ISOLATION":
        return isolation().network
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def allow_unconfined(allow: bool = True) -> None:
    """Let ``run_python`` run programs without isolation where nothing can isolate them (the config's
    ``sandbox.unconfined: true``); set through the environment so that worker processes inherit it."""
    if allow:
        os.environ[UNCONFINED_ENV] = "1"
    else:
        os.environ.pop(UNCONFINED_ENV, None)


def run_python(code: str, stdin: str = "", timeout: float = 5.0, limits: Limits | None = None) -> ExecResult:
    """Run ``code`` as ``python -I main.py`` in a fresh sandbox and return what happened.

    Raises :class:`SandboxUnavailable` where nothing can isolate the program (see the module docstring)
    unless unconfined runs were allowed (:func:`allow_unconfined`, ``sandbox.unconfined: true``)."""
    iso = isolation()
    if not iso.namespaces and os.environ.get(UNCONFINED_ENV) != "1":
        raise SandboxUnavailable(f"atgrpo.sandbox: cannot isolate programs on this machine ({iso.reason}); "
                                 "set `sandbox.unconfined: true` in the config (or ATGRPO_SANDBOX_UNCONFINED=1) "
                                 "to run them unconfined anyway")
    return _run(code, stdin, timeout, limits or Limits(), iso)


Job = tuple  # (code,) | (code, stdin) | (code, stdin, timeout)


class SandboxPool:
    """Runs many sandboxes concurrently (threads, each waiting on its own subprocess)."""

    def __init__(self, max_workers: int | None = None, limits: Limits | None = None) -> None:
        self.limits = limits
        self._executor = ThreadPoolExecutor(max_workers or os.cpu_count() or 1, thread_name_prefix="sandbox")

    def map(self, jobs: Sequence[Job], limits: Limits | None = None) -> list[ExecResult]:
        """Run ``(code, stdin, timeout)`` jobs (under ``limits``, else the pool's); results come back in the order
        of ``jobs``."""
        futures = [self._executor.submit(run_python, *job, limits=limits or self.limits) for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_many(jobs: Sequence[Job], max_workers: int | None = None, limits: Limits | None = None) -> list[ExecResult]:
    """Convenience wrapper: run ``jobs`` on a temporary :class:`SandboxPool`."""
    with SandboxPool(max_workers, limits) as pool:
        return pool.map(jobs)
