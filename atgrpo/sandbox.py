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
        - private network namespace (only a down loopback) unless ``Limits.network``.
    * Root without CAP_SYS_ADMIN (e.g. a default Docker container): the uid drop still
      happens if the interpreter is reachable by other users (e.g. /usr/local/bin), but
      processes that leave the process group (``setsid``) can outlive the run.  If it
      is not reachable either, the program runs AS ROOT and a RuntimeWarning is issued.
    * Not root: resource limits, scrubbed env, process-group kill, and network
      isolation via an unprivileged user namespace where the kernel allows it.

What is NOT isolated
    This is a guard-rail against buggy or greedy programs, not a security boundary:
    no seccomp filter, the kernel is shared (kernel exploits win), world-readable
    files (``/etc``, the repository, site-packages) can be read, memory is limited by
    address space (not cgroups), disk use in the working directory only per file.
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
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Iterator, Sequence

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
    drop = root and (namespaces or not blocked)
    if root and not drop:
        warnings.warn(f"atgrpo.sandbox: running untrusted code AS ROOT (no mount namespace to expose "
                      f"{sorted(blocked)} to an unprivileged uid); fork bombs are not contained and "
                      "programs can kill any process", RuntimeWarning, stacklevel=2)
    return Isolation(namespaces, network, drop, reveal)


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
    pid_fd: int             # where the outer waiter reports the init's pid
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


def _close_fds(keep: int | None = None) -> None:
    """Close every fd but ``keep`` (os.closerange uses close_range(2): cheap)."""
    if keep:  # note: closerange(0, 0) would close everything
        os.closerange(0, keep)
    os.closerange(0 if keep is None else keep + 1, 1 << 20)


def _child_main(plan: _ChildPlan) -> None:
    """Pre-exec hook, run in the forked child (already a session leader).

    With namespaces it forks twice: this process (P0) waits outside the new PID
    namespace and reports the pid of its child, the namespace's init (P1), which reaps,
    reports the program's status and exits with it -- the kernel then kills everything
    left in the namespace; the grandchild returns to exec the program.  P0 and P1 close
    every inherited fd so that only the program holds the pipes.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if plan.unshare:
        _unshare(plan.unshare)
    if not plan.namespaces:
        return _become_sandboxed(plan)
    init = os.fork()
    if init:
        try:
            os.write(plan.pid_fd, init.to_bytes(4, "little"))
            _close_fds()
            os.waitpid(init, 0)
        finally:
            os._exit(0)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _setup_mounts(plan)  # errors here reach the parent as a SubprocessError
    program = os.fork()
    if program == 0:
        return _become_sandboxed(plan)
    try:
        _close_fds(keep=plan.status_fd)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == program:
                os.write(plan.status_fd, status.to_bytes(4, "little"))
                break
    finally:
        os._exit(0)


def _open_init(proc: subprocess.Popen, pid_fd: int) -> int | None:
    """A pidfd for the namespace init P1 (None if it is already gone).

    P1 is P0's child and only P0 could reap it, so if the pid still has parent P0
    after opening the pidfd, the pidfd is P1's and not a recycled pid's.
    """
    pid = int.from_bytes(os.read(pid_fd, 4), "little")
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid:
                return fd
    except (OSError, ValueError, IndexError):
        pass
    os.close(fd)
    return None


def _killer(proc: subprocess.Popen, init_fd: int | None):
    """Kill the sandbox: its PID-namespace init if there is one, else its process group.

    Only the init is killed in namespace mode: the kernel then kills the namespace and
    P0 reaps P1 and exits.  (Killing P0 too would orphan P1 mid-teardown.)
    """
    def kill() -> None:
        with suppress(ProcessLookupError, PermissionError):
            if init_fd is not None:
                signal.pidfd_send_signal(init_fd, signal.SIGKILL)
            elif proc.returncode is None:  # not reaped yet, so the group id is still ours
                os.killpg(proc.pid, signal.SIGKILL)
    return kill


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float, cap: int, kill) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and collect capped stdout/stderr until the program and its pipes are done.

    Never reaps ``proc`` (its pid must stay valid as our process-group id). Returns
    (stdout, stderr, timed_out, truncated); on timeout, or once a stream runs far past
    the cap, the sandbox is killed (with a short grace to drain what is already written).
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
    timed_out = False
    deadline, stop_at = time.monotonic() + timeout, None  # stop_at: grace for draining after a kill
    while any(fd in kept for fd in sel.get_map()) or not exited:
        now = time.monotonic()
        if stop_at is None and now >= deadline:
            timed_out, stop_at = True, now + 1.0
            kill()
        if stop_at is not None and now >= stop_at:
            break
        for key, _ in sel.select((stop_at or deadline) - now):
            fd = key.fd
            if fd == pidfd:  # program gone: kill stragglers so the pipes close
                exited = True
                sel.unregister(fd)
                kill()
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
                    stop_at = time.monotonic() + 1.0
                    kill()
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    with suppress(OSError):
        proc.stdin.close()
    return bytes(kept[out]), bytes(kept[err]), timed_out, seen[out] > cap or seen[err] > cap


def _env(workdir: str) -> dict[str, str]:
    """A fresh environment; nothing is inherited from ours.

    MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per malloc arena (up to
    8 per core), so under RLIMIT_AS a program with a dozen threads could not start them.
    """
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "MALLOC_ARENA_MAX": "2"}


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


@contextmanager
def _workspace(code: str, drop_privileges: bool) -> Iterator[tuple[str, int | None]]:
    """A fresh working directory holding ``main.py`` (owned by a fresh sandbox uid)."""
    uid = _UIDS.acquire() if drop_privileges else None
    workdir = None
    try:
        workdir = tempfile.mkdtemp(prefix="atgrpo-sbx-")
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(script, uid, uid)
        yield workdir, uid
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _UIDS.release(uid)


class _Pipe:
    """``os.pipe()`` closed on exit; the child inherits ``w`` (closed here after the fork)."""

    def __enter__(self) -> _Pipe:
        self.r, self.w = os.pipe()
        return self

    def close_write(self) -> None:
        os.close(self.w)
        self.w = None

    def __exit__(self, *exc) -> None:
        for fd in (self.r, self.w):
            if fd is not None:
                os.close(fd)


def _program_returncode(proc: subprocess.Popen, status_r: int, namespaces: bool) -> int:
    """Popen-style return code of the program itself (negative: killed by that signal)."""
    if not namespaces:
        return proc.returncode
    os.set_blocking(status_r, False)
    status = b""
    with suppress(BlockingIOError):
        status = os.read(status_r, 4)
    if len(status) < 4:  # the init was killed (by us) before it could report
        return -signal.SIGKILL
    return os.waitstatus_to_exitcode(int.from_bytes(status, "little"))


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
