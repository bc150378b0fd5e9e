"""Run untrusted Python code (written by LLM agents during RL training) with limits.

``run_python(code, stdin, timeout, limits)`` executes ``code`` with ``python -I``
(``sys.executable``) in a child process and returns an :class:`ExecResult`.  It never
raises because of what the program does (syntax errors, exceptions, ``sys.exit``,
crashes, signals, floods of output); it only raises when the sandbox itself cannot be
set up.  :class:`SandboxPool` / :func:`run_many` run many programs on a thread pool.

What is isolated
    * Fresh temporary working directory (``HOME`` too; created by ``tempfile``, so
      ``TMPDIR`` must be traversable by other users, as /tmp is), removed after the run.
    * Scrubbed environment: only ``PATH``, ``LANG``, ``HOME`` (and ``MALLOC_ARENA_MAX``
      so that threads fit under the address-space limit); nothing inherited.
    * ``setrlimit`` in the child: CPU seconds, address space, file size, processes,
      no core dumps.  Output is read incrementally and capped per stream; a program
      that keeps writing far past the cap is killed.
    * Timeout: SIGKILL to the PID namespace's init (below), which takes the whole
      namespace down, or else to the whole process group; the same kill always happens
      after a run, so no grandchild survives it.  If our own process is SIGKILLed, the
      sandbox dies with it (parent-death signal) but its working directory stays.
    * When running as root (with CAP_SYS_ADMIN) -- the normal case on training boxes:
        - the program runs as an unprivileged uid unique to the run (``UID_BASE`` +
          ``64 * pid + slot``, not in /etc/passwd) with ``no_new_privs``.  Root ignores
          ``RLIMIT_NPROC``; an ordinary uid does not, so fork bombs are contained, the
          limit is not shared between concurrent runs, and the program can neither
          signal its parent nor write to root-owned directories.
        - private PID namespace: a tiny init (forked from the parent in the
          pre-exec hook) reaps everything and exits with the program, at which point
          the kernel kills whatever is left -- including processes that escaped the
          process group with ``setsid``.  ``/proc`` shows only the sandbox.
        - private mount namespace: fresh size-limited tmpfs over the world-writable
          ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` (so files written there
          vanish with the run; the working directory is bind-mounted back); directories
          the sandbox uid cannot traverse but that hold the interpreter (e.g. pyenv
          under ``/root``) are covered by a tmpfs that re-exposes only the interpreter.
        - atgrpo's own source directory is covered by an empty read-only tmpfs: a
          program can neither import nor read the trainer (an environment's solver, say),
          even when atgrpo is installed in the interpreter's site-packages.
        - private network namespace (only a down loopback) unless ``Limits.network``.
    * Root without CAP_SYS_ADMIN (e.g. a default Docker container): the uid drop still
      happens if the interpreter is reachable by other users (e.g. /usr/local/bin), but
      processes that leave the process group (``setsid``) can outlive the run.  If it
      is not reachable either, the program runs AS ROOT and a RuntimeWarning is issued.
    * Not root: resource limits, scrubbed env, process-group kill, and network
      isolation via an unprivileged user namespace where the kernel allows it.
      atgrpo's source stays importable and readable (no mount namespace).

What is NOT isolated
    This is a guard-rail against buggy or greedy programs, not a security boundary:
    no seccomp filter, the kernel is shared (kernel exploits win), world-readable
    files (``/etc``, the repository outside atgrpo's package, site-packages) can be
    read, memory is limited by address space (not cgroups), disk use in the working
    directory only per file.
    The pre-exec hook forks from the (possibly multi-threaded) caller and runs only
    plain syscalls via ``os``/``ctypes`` before exec.

Network isolation
    ``NETWORK_ISOLATION`` (module attribute, probed lazily on first access) says whether
    programs get an empty network namespace.  It needs ``unshare(CLONE_NEWNET)``: run as
    root / with CAP_SYS_ADMIN, or as a normal user with unprivileged user namespaces
    enabled (``sysctl kernel.unprivileged_userns_clone=1``,
    ``kernel.apparmor_restrict_unprivileged_userns=0``; in Docker e.g.
    ``--cap-add SYS_ADMIN`` or a seccomp profile that permits ``unshare``).  When it is
    False, programs can reach the network; see also :func:`isolation`.
"""

from __future__ import annotations

import functools
import math
import os
import re
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from .confine import (_CLONE_NEWNET, _CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWUSER, Isolation, _child_main,
                      _ChildPlan, isolation, leftover_processes)
from .process import _communicate, _env, _killer, _open_init, _Pipe, _program_returncode, _workspace

__all__ = ["ExecResult", "Isolation", "Limits", "SandboxPool", "isolation",
           "leftover_processes", "run_many", "run_python", "NETWORK_ISOLATION"]

_MEMORY_ERROR = re.compile(rb"MemoryError|Cannot allocate memory|out of memory")


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits (sizes in MiB)."""

    cpu_seconds: int | None = None   # None: the timeout rounded up, plus one second
    memory_mb: int = 512             # address space (RLIMIT_AS)
    file_size_mb: int = 16           # largest file it may write; also the size of its private /tmp
    max_processes: int = 64          # processes + threads of the sandbox uid (RLIMIT_NPROC)
    max_output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    network: bool = False            # allow network access (skip the network namespace)


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int | None        # None when killed by a signal
    timed_out: bool
    memory_exceeded: bool        # heuristic: failed with MemoryError / ENOMEM in stderr
    output_truncated: bool       # a stream produced more than Limits.max_output_bytes
    killed_by_signal: int | None
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def __getattr__(name: str):  # PEP 562: NETWORK_ISOLATION is probed on first access
    if name == "NETWORK_ISOLATION":
        return isolation().network
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rlimits(limits: Limits, timeout: float) -> tuple[tuple[int, int, int], ...]:
    cpu = limits.cpu_seconds or math.ceil(timeout) + 1
    mem, fsize = limits.memory_mb << 20, limits.file_size_mb << 20
    return ((resource.RLIMIT_CPU, cpu, cpu + 1),  # soft: SIGXCPU, hard: SIGKILL
            (resource.RLIMIT_AS, mem, mem),
            (resource.RLIMIT_FSIZE, fsize, fsize),
            (resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes),
            (resource.RLIMIT_CORE, 0, 0))


def _unshare_flags(iso: Isolation, limits: Limits) -> int:
    flags = _CLONE_NEWNS | _CLONE_NEWPID if iso.namespaces else 0
    if iso.network and not limits.network:
        flags |= _CLONE_NEWNET if os.geteuid() == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    return flags


def run_python(code: str, stdin: str = "", timeout: float = 5.0, limits: Limits | None = None) -> ExecResult:
    """Run ``code`` as ``python -I main.py`` in a fresh sandbox and return what happened."""
    limits = limits or Limits()
    iso = isolation()
    with _workspace(code, iso.drop_privileges) as (workdir, uid), _Pipe() as pid_pipe, _Pipe() as status_pipe:
        plan = _ChildPlan(workdir, uid, _rlimits(limits, timeout), _unshare_flags(iso, limits), iso.namespaces,
                          iso.reveal, limits.file_size_mb, pid_pipe.w, status_pipe.w)
        start = time.monotonic()
        with subprocess.Popen([sys.executable, "-I", "main.py"], cwd=workdir, env=_env(workdir),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True, preexec_fn=functools.partial(_child_main, plan)) as proc:
            pid_pipe.close_write()
            status_pipe.close_write()
            init_fd = _open_init(proc, pid_pipe.r) if iso.namespaces else None
            kill = _killer(proc, init_fd)
            try:
                out, err, timed_out, truncated = _communicate(proc, stdin.encode(), timeout,
                                                              limits.max_output_bytes, kill)
            finally:
                kill()  # always, so that nothing outlives the run; before reaping (group id stays ours)
                proc.wait()
                if init_fd is not None:
                    os.close(init_fd)
        wall = time.monotonic() - start
        returncode = _program_returncode(proc, status_pipe.r, iso.namespaces)
    signaled = -returncode if returncode < 0 else None
    return ExecResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        exit_code=None if signaled else returncode,
        timed_out=timed_out,
        memory_exceeded=returncode != 0 and bool(_MEMORY_ERROR.search(err[-4096:])),
        output_truncated=truncated,
        killed_by_signal=signaled,
        wall_seconds=wall,
    )


Job = tuple  # (code,) | (code, stdin) | (code, stdin, timeout)


class SandboxPool:
    """Runs many sandboxes concurrently (threads, each waiting on its own subprocess)."""

    def __init__(self, max_workers: int | None = None, limits: Limits | None = None) -> None:
        self.limits = limits
        self._executor = ThreadPoolExecutor(max_workers or os.cpu_count() or 1, thread_name_prefix="sandbox")

    def map(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run ``(code, stdin, timeout)`` jobs; results come back in the order of ``jobs``."""
        futures = [self._executor.submit(run_python, *job, limits=self.limits) for job in jobs]
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
