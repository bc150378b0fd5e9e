"""Run untrusted Python code (written by LLM agents during RL training) with limits.

``run_python(code, stdin, timeout, limits)`` executes ``code`` with ``python -I``
(``sys.executable``) in a child process and returns an :class:`ExecResult`.  It never
raises because of what the program does (syntax errors, exceptions, ``sys.exit``,
crashes, signals, floods of output); it only raises when the sandbox itself cannot be
set up.  :class:`SandboxPool` / :func:`run_many` run many programs on a thread pool.

What is isolated
    * Fresh temporary working directory (``HOME`` too), removed after the run.
    * Scrubbed environment: only ``PATH``, ``LANG`` and ``HOME``; nothing inherited.
    * ``setrlimit`` in the child: CPU seconds, address space, file size, processes,
      no core dumps.  Output is read incrementally and capped per stream; a program
      that keeps writing far past the cap is killed.
    * Timeout: the whole process group (and namespace, below) gets SIGKILL; the same
      kill always happens after a run, so no grandchild survives it.
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
        - private network namespace (only a down loopback) unless ``Limits.network``.
    * Not root: resource limits, scrubbed env, process-group kill, and network
      isolation via an unprivileged user namespace where the kernel allows it.

What is NOT isolated
    This is a guard-rail against buggy or greedy programs, not a security boundary:
    no seccomp filter, the kernel is shared (kernel exploits win), world-readable
    files (``/etc``, the repository, site-packages) can be read, memory is limited by
    address space (not cgroups), disk use in the working directory only per file.

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

import ctypes
import functools
import math
import os
import re
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ExecResult", "Isolation", "Limits", "SandboxPool", "isolation",
           "leftover_processes", "run_many", "run_python", "NETWORK_ISOLATION"]

UID_BASE = 1_000_000_000  # sandbox uids: UID_BASE + 64 * parent pid + slot
_SLOTS = 64               # concurrent runs per parent process
_SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_MEMORY_ERROR = re.compile(rb"MemoryError|Cannot allocate memory|out of memory")

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_libc = ctypes.CDLL(None, use_errno=True)  # loaded up front: the pre-exec hook must not dlopen


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


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do (see the module docstring)."""

    namespaces: bool        # private PID + mount namespaces
    network: bool           # private network namespace
    drop_privileges: bool   # run as a per-run unprivileged uid
    reveal: tuple[tuple[str, tuple[str, ...]], ...]  # (untraversable dir, interpreter dirs in it)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


def _probe(flags: int) -> bool:
    """Can a child process unshare these namespaces?"""
    try:
        subprocess.run([sys.executable, "-S", "-c", ""], preexec_fn=lambda: _unshare(flags), check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        return True
    except (subprocess.SubprocessError, OSError):
        return False


def _untraversable_ancestors() -> dict[str, list[str]]:
    """Directories on the way to the interpreter that 'other' users cannot enter."""
    blocked: dict[str, list[str]] = {}
    for needed in {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}:
        parts = needed.split(os.sep)
        for i in range(2, len(parts) + 1):
            directory = os.sep.join(parts[:i])
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                blocked.setdefault(directory, []).append(needed)
                break
    return blocked


@functools.cache
def isolation() -> Isolation:
    """Probe (once) which isolation features this machine supports."""
    root = os.geteuid() == 0
    namespaces = root and _probe(_CLONE_NEWNS | _CLONE_NEWPID)
    network = _probe(_CLONE_NEWNET if root else _CLONE_NEWUSER | _CLONE_NEWNET)
    blocked = _untraversable_ancestors()
    reveal = tuple((d, tuple(sorted(k))) for d, k in sorted(blocked.items())) if namespaces else ()
    return Isolation(namespaces, network, root and (namespaces or not blocked), reveal)


def __getattr__(name: str):  # PEP 562: NETWORK_ISOLATION is probed on first access
    if name == "NETWORK_ISOLATION":
        return isolation().network
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _UidSlots:
    """Hands out a distinct sandbox uid to each concurrent run of this process."""

    def __init__(self) -> None:
        self._free = list(range(_SLOTS))
        self._cond = threading.Condition()

    def acquire(self) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            return UID_BASE + _SLOTS * os.getpid() + self._free.pop()

    def release(self, uid: int) -> None:
        with self._cond:
            self._free.append((uid - UID_BASE) % _SLOTS)
            self._cond.notify()


_UIDS = _UidSlots()


def leftover_processes() -> list[int]:
    """PIDs of live processes owned by this process's sandbox uids (empty between runs)."""
    low = UID_BASE + _SLOTS * os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        with suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
            if low <= uid < low + _SLOTS:
                pids.append(int(entry))
    return pids


@dataclass(frozen=True)
class _ChildPlan:
    workdir: str
    uid: int | None
    rlimits: tuple[tuple[int, int, int], ...]
    unshare: int            # namespaces to create
    namespaces: bool        # PID + mount namespace with our own init
    reveal: tuple[tuple[str, tuple[str, ...]], ...]
    tmpfs_mb: int
    status_fd: int          # where the init reports the program's wait status


def _cover(target: str, mode: int, keep: Sequence[str], size_mb: int) -> None:
    """Mount a fresh tmpfs over ``target``, bind-mounting the ``keep`` subtrees back in."""
    fds = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep]
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={mode:o},size={size_mb}m")
    for path, fd in zip(keep, fds):
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)


def _setup_mounts(plan: _ChildPlan) -> None:
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # never propagate back to the host
    with suppress(OSError):
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for target in _SHARED_TMP_DIRS:
        if os.path.isdir(target) and not os.path.islink(target):
            keep = [plan.workdir] if plan.workdir.startswith(target + os.sep) else []
            _cover(target, 0o1777, keep, plan.tmpfs_mb)
    for target, keep in plan.reveal:
        _cover(target, 0o755, keep, 1)


def _become_sandboxed(plan: _ChildPlan) -> None:
    """Last step before exec: limits, then drop to the sandbox uid."""
    for res, soft, hard in plan.rlimits:
        resource.setrlimit(res, (soft, hard))
    if plan.uid is not None:
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(plan.workdir)


def _close_fds_except(keep: int) -> None:
    os.closerange(0, keep)
    os.closerange(keep + 1, 1 << 20)


def _child_main(plan: _ChildPlan) -> None:
    """Pre-exec hook, run in the forked child (already a session leader).

    With namespaces it forks twice: this process waits outside the new PID namespace,
    its child is the namespace's init (reaps, reports the program's status, exits with
    it -- killing everything left), and the grandchild returns to exec the program.
    The two waiters close every inherited fd so that only the program holds the pipes.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if plan.unshare:
        _unshare(plan.unshare)
    if not plan.namespaces:
        return _become_sandboxed(plan)
    init = os.fork()
    if init:
        try:
            _close_fds_except(plan.status_fd)
            os.close(plan.status_fd)
            os.waitpid(init, 0)
        finally:
            os._exit(0)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _setup_mounts(plan)  # errors here reach the parent as a SubprocessError
    program = os.fork()
    if program == 0:
        return _become_sandboxed(plan)
    try:
        _close_fds_except(plan.status_fd)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == program:
                os.write(plan.status_fd, status.to_bytes(4, "little"))
                break
    finally:
        os._exit(0)


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and collect capped stdout/stderr until the program and its pipes are done.

    Never reaps ``proc`` (its pid must stay valid as our process-group id). Returns
    (stdout, stderr, timed_out, flooded); on timeout or flooding the group is killed.
    """
    flood_limit = max(8 * cap, 1 << 20)
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    kept, seen = {out: bytearray(), err: bytearray()}, {out: 0, err: 0}
    sel = selectors.DefaultSelector()
    for fd in kept:
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd, pos = proc.stdin.fileno(), 0
    if data:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    try:  # a pidfd tells us when the program exits without reaping it
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None
    exited = pidfd is None
    timed_out = flooded = False
    deadline, stop_at = time.monotonic() + timeout, None  # stop_at: grace for draining after a kill
    while any(fd in kept for fd in sel.get_map()) or not exited:
        now = time.monotonic()
        if stop_at is None and now >= deadline:
            timed_out, stop_at = True, now + 1.0
            _kill_group(proc.pid)
        if stop_at is not None and now >= stop_at:
            break
        for key, _ in sel.select((stop_at or deadline) - now):
            fd = key.fd
            if fd == pidfd:  # program gone: kill stragglers so the pipes close
                exited = True
                sel.unregister(fd)
                _kill_group(proc.pid)
            elif fd == stdin_fd:
                try:
                    pos += os.write(fd, data[pos:pos + 65536])
                except BrokenPipeError:
                    pos = len(data)
                if pos >= len(data):
                    sel.unregister(fd)
                    with suppress(OSError):
                        proc.stdin.close()
            else:
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                seen[fd] += len(chunk)
                kept[fd] += chunk[: max(0, cap - len(kept[fd]))]
                if seen[fd] > flood_limit and stop_at is None:
                    flooded, stop_at = True, time.monotonic() + 1.0
                    _kill_group(proc.pid)
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    with suppress(OSError):
        proc.stdin.close()
    truncated = seen[out] > cap or seen[err] > cap
    return bytes(kept[out]), bytes(kept[err]), timed_out, flooded or truncated


def _env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir}


def run_python(code: str, stdin: str = "", timeout: float = 5.0, limits: Limits | None = None) -> ExecResult:
    """Run ``code`` as ``python -I main.py`` in a fresh sandbox and return what happened."""
    limits = limits or Limits()
    iso = isolation()
    cpu = limits.cpu_seconds or math.ceil(timeout) + 1
    mib = 1 << 20
    rlimits = ((resource.RLIMIT_CPU, cpu, cpu + 1),
               (resource.RLIMIT_AS, limits.memory_mb * mib, limits.memory_mb * mib),
               (resource.RLIMIT_FSIZE, limits.file_size_mb * mib, limits.file_size_mb * mib),
               (resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes),
               (resource.RLIMIT_CORE, 0, 0))
    unshare = _CLONE_NEWNET if iso.network and not limits.network else 0
    if unshare and os.geteuid() != 0:
        unshare |= _CLONE_NEWUSER
    if iso.namespaces:
        unshare |= _CLONE_NEWNS | _CLONE_NEWPID
    uid = _UIDS.acquire() if iso.drop_privileges else None
    workdir = status_r = status_w = proc = None
    try:
        workdir = tempfile.mkdtemp(prefix="atgrpo-sbx-")
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            for path in (workdir, os.path.join(workdir, "main.py")):
                os.chown(path, uid, uid)
        status_r, status_w = os.pipe()
        plan = _ChildPlan(workdir, uid, rlimits, unshare, iso.namespaces, iso.reveal,
                          limits.file_size_mb, status_w)
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "main.py"], cwd=workdir, env=_env(workdir),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=functools.partial(_child_main, plan))
        os.close(status_w)
        status_w = None
        out, err, timed_out, truncated = _communicate(proc, stdin.encode(), timeout, limits.max_output_bytes)
        _kill_group(proc.pid)  # always, and before reaping so the group id cannot be reused
        proc.wait()
        wall = time.monotonic() - start
        os.set_blocking(status_r, False)
        status = b""
        with suppress(BlockingIOError):
            status = os.read(status_r, 4)
        returncode = proc.returncode
        if iso.namespaces and len(status) == 4:  # the init reported the program's own status
            returncode = os.waitstatus_to_exitcode(int.from_bytes(status, "little"))
    finally:
        for fd in (status_r, status_w):
            if fd is not None:
                os.close(fd)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _UIDS.release(uid)
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
