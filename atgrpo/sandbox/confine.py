"""The sandbox's child side: namespaces, mounts, uid slots and the pre-exec hook.

Plain syscalls via ``os``/``ctypes`` (``unshare``, ``mount``, ``prctl``), the probe of
what this machine allows (:func:`isolation`), the per-run sandbox uids, and
:func:`_child_main`, run in the forked child before exec.  See the ``atgrpo.sandbox``
docstring for what is isolated.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import warnings
from contextlib import suppress
from dataclasses import dataclass
from typing import Sequence

UID_BASE = 1_000_000_000  # sandbox uids: UID_BASE + 64 * parent pid + slot
_SLOTS = 64               # concurrent runs per parent process
_SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_libc = ctypes.CDLL(None, use_errno=True)  # loaded up front: the pre-exec hook must not dlopen


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do (see the ``atgrpo.sandbox`` docstring)."""

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


@functools.cache
def _interpreter_dirs() -> tuple[str, ...]:
    """The directories the interpreter needs (its prefixes and the executable's folder), as given and resolved:
    a virtual environment under /tmp (a CI checkout, say) must stay visible when /tmp is covered."""
    dirs = {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)}
    return tuple(sorted(dirs | {os.path.realpath(d) for d in dirs}))


def _outermost(paths: Sequence[str]) -> list[str]:
    """Drop paths that lie inside another one of ``paths`` (binding the outer one brings them along)."""
    out = sorted(set(paths))
    return [p for p in out if not any(p != q and p.startswith(q.rstrip(os.sep) + os.sep) for q in out)]


@functools.cache
def _package_dirs() -> tuple[str, ...]:
    """atgrpo's own source directory, as given and resolved: hidden from programs, so that nothing of the
    trainer (e.g. an environment's solver) can be imported or read from inside the sandbox."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(sorted({here, os.path.realpath(here)}))


def _setup_mounts(plan: _ChildPlan) -> None:
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # never propagate back to the host
    with suppress(OSError):
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for target in _SHARED_TMP_DIRS:
        if os.path.isdir(target) and not os.path.islink(target):
            inside = [p for p in (plan.workdir, *_interpreter_dirs()) if p.startswith(target + os.sep)]
            _cover(target, 0o1777, _outermost(inside), plan.tmpfs_mb)
    for target, keep in plan.reveal:
        _cover(target, 0o755, keep, 1)
    for target in _package_dirs():
        if not os.path.isdir(target):  # under a directory covered above (a checkout in /tmp): already out of sight
            continue
        inside = [p for p in (plan.workdir, *_interpreter_dirs()) if p.startswith(target.rstrip(os.sep) + os.sep)]
        _cover(target, 0o555, _outermost(inside), 1)


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
