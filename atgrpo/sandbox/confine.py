"""The sandbox's child side: namespaces, the minimal root, uid slots and the pre-exec hook.

Plain syscalls via ``os``/``ctypes`` (``unshare``, ``mount``, ``pivot_root``, ``prctl``), the probe of
what this machine allows (:func:`isolation`), the per-run sandbox uids, and :func:`_child_main`, run in
the forked child before exec. See the ``atgrpo.sandbox`` docstring for what is isolated and
``root.py`` for what the root holds.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import platform
import resource
import signal
import tempfile
import threading
from contextlib import suppress
from dataclasses import dataclass

from . import seccomp
from .root import Bind, RootSpec

UID_BASE = 1_000_000_000  # sandbox uids (as root): UID_BASE + 64 * parent pid + slot
_SLOTS = 64               # concurrent runs per parent process

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)  # loaded up front: the pre-exec hook must not dlopen
# The namespace's init: /bin/sh runs the program and exits with its status (128 + n: killed by signal n).
INIT_SCRIPT = 'unset PWD; "$@"; exit $?'


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do (see the ``atgrpo.sandbox`` docstring)."""

    mode: str               # "root" | "userns" (a minimal root in namespaces) | "none" (nothing isolates)
    network: bool           # private network namespace
    seccomp: bool           # the system-call filter can be installed
    reason: str = ""        # why mode is "none"

    @property
    def namespaces(self) -> bool:
        return self.mode != "none"

    @property
    def drop_privileges(self) -> bool:  # programs never run as root (or as root of a user namespace)
        return self.mode != "none" or os.geteuid() != 0


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
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
           "prctl")


class _UidSlots:
    """Hands out a distinct sandbox uid to each concurrent run of this process (root only)."""

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
    """PIDs of live sandbox processes of this process (empty between runs): its sandbox uids' processes,
    and its descendants that live in a PID namespace below its own."""
    low, me = UID_BASE + _SLOTS * os.getpid(), os.getpid()
    info: dict[int, tuple[int, int, int]] = {}  # pid -> (ppid, uid, pid-namespace depth)
    for entry in os.listdir("/proc"):
        with suppress(OSError, ValueError, IndexError, StopIteration):
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            info[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[1]), len(fields["NSpid"].split()))
    depth = info.get(me, (0, 0, 1))[2]
    out = []
    for pid, (ppid, uid, d) in info.items():
        if low <= uid < low + _SLOTS:
            out.append(pid)
            continue
        seen = 0
        while d > depth and ppid in info and ppid != me and seen < 4096:
            ppid, seen = info[ppid][0], seen + 1
        if d > depth and ppid == me:
            out.append(pid)
    return sorted(out)


@dataclass(frozen=True)
class _ChildPlan:
    workdir: str                # inside the sandbox's private /tmp
    code: bytes                 # main.py
    uid: int | None             # root mode: the per-run uid
    gid_uid: tuple[int, int]    # userns mode: our own (uid, gid), mapped to themselves
    rlimits: tuple[tuple[int, int, int], ...]
    unshare: int                # namespaces to create (0: unconfined)
    userns: bool
    spec: RootSpec | None
    packages: tuple[Bind, ...]
    mountpoint: str             # an empty host directory the root is mounted on before pivot_root
    tmpfs_mb: int
    filter: seccomp.Prepared | None
    pid_fd: int                 # where the outer waiter reports the init's pid
    status_fd: int              # where it reports the init's wait status


@functools.cache
def _mountpoint() -> str:
    path = tempfile.mkdtemp(prefix="atgrpo-root-")
    os.chmod(path, 0o755)
    atexit.register(lambda: os.path.isdir(path) and os.rmdir(path))
    return path


def mountpoint() -> str:
    """The empty directory the roots are mounted on (re-made if something cleaned /tmp)."""
    path = _mountpoint()
    if not os.path.isdir(path):
        os.mkdir(path, 0o755)
    return path


def _bind(root: str, b: Bind, readonly: bool = True) -> None:
    dst = root + b.dst
    if not b.is_dir:
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644))
    elif not os.path.isdir(dst):
        os.mkdir(dst, 0o755)
    _mount(b.src, dst, None, _MS_BIND | _MS_REC)
    if readonly:
        _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | b.flags)


def _build_root(plan: _ChildPlan) -> None:
    """Mount the minimal root, switch to it, drop the host's mounts (run as the namespace's pid 1)."""
    spec, root = plan.spec, plan.mountpoint
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # never propagate back to the host
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=1m,nr_inodes=1024")
    in_tmp = [d for d in spec.dirs if d.startswith("/tmp/")]  # an interpreter under /tmp: in the private tmpfs
    for d in spec.dirs:
        if d not in in_tmp:
            os.mkdir(root + d, 0o755)
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"mode=1777,size={plan.tmpfs_mb}m,nr_inodes=16384")
    for d in in_tmp:
        os.mkdir(root + d, 0o755)
    for path, target in spec.links:
        os.symlink(target, root + path)
    for b in spec.binds:
        _bind(root, b, readonly=not b.dst.startswith("/dev/"))
    for i, cover in enumerate(spec.covers):
        packages = plan.packages if i == 0 else ()
        if not packages and cover not in spec.masks:  # an empty directory of the read-only root
            continue
        flags = _MS_NOSUID | _MS_NODEV | (0 if packages else _MS_RDONLY)
        _mount("tmpfs", root + cover, "tmpfs", flags, "mode=755,size=64k,nr_inodes=256")
        for b in packages:
            _bind(root, b)
        if packages:
            _mount(None, root + cover, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    workdir = root + plan.workdir
    os.mkdir(workdir, 0o700)
    fd = os.open(workdir + "/main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, plan.code)  # a pipe-free write to a fresh tmpfs file: whole
    os.close(fd)
    if plan.uid is not None:
        os.chown(workdir, plan.uid, plan.uid)
        os.chown(workdir + "/main.py", plan.uid, plan.uid)
    with suppress(OSError):  # a user namespace may not mount proc (a masked /proc): then none at all
        _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    old = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    os.chdir(root)
    _check(_libc.syscall(_SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    os.fchdir(old)  # the old root is stacked on the new one: detach it
    os.close(old)
    _check(_libc.umount2(b".", _MNT_DETACH), "umount2")
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _become_sandboxed(plan: _ChildPlan) -> None:
    """Last step before exec: limits, the sandbox uid, no_new_privs, the syscall filter."""
    for res, soft, hard in plan.rlimits:
        resource.setrlimit(res, (soft, hard))
    if plan.uid is not None:
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # a uid change clears it
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if plan.filter is not None:
        seccomp.install(_libc, plan.filter)
    os.chdir(plan.workdir)


def _close_fds(keep: int | None = None) -> None:
    """Close every fd but ``keep`` (os.closerange uses close_range(2): cheap)."""
    if keep:  # note: closerange(0, 0) would close everything
        os.closerange(0, keep)
    os.closerange(0 if keep is None else keep + 1, 1 << 20)


def _write_id_maps(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _child_main(plan: _ChildPlan) -> None:
    """Pre-exec hook, run in the forked child (already a session leader).

    Unconfined (``plan.unshare == 0``): limits and the filter, then exec. Otherwise this process (P0)
    creates the namespaces and forks P1, pid 1 of the new PID namespace; P0 stays outside, reports P1's
    pid, waits for it and reports its wait status. P1 builds the minimal root, drops to the sandbox uid,
    installs the filter and returns to exec /bin/sh (``INIT_SCRIPT``), which runs the program: pid 1 is an
    exec'd shell, not a copy of the trainer. When it exits the kernel kills what is left in the namespace.
    """
    try:
        _setup(plan)
    except BaseException as e:  # tell the parent why (Popen only says "Exception occurred in preexec_fn")
        with suppress(OSError):
            os.write(plan.status_fd, f"E:{type(e).__name__}: {e}"[:500].encode() + b"\n")
        raise


def _setup(plan: _ChildPlan) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if not plan.unshare:
        return _become_sandboxed(plan)
    _unshare(plan.unshare)
    if plan.userns:
        _write_id_maps(*plan.gid_uid)
    init = os.fork()
    if init:
        try:
            os.write(plan.pid_fd, init.to_bytes(4, "little"))
            _close_fds(keep=plan.status_fd)
            _, status = os.waitpid(init, 0)
            os.write(plan.status_fd, status.to_bytes(4, "little"))
        finally:
            os._exit(0)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _build_root(plan)  # errors here reach the parent as a SubprocessError
    _become_sandboxed(plan)
