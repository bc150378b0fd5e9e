"""One run of a program: the plan handed to the child, the pipes, the result; and the probe of what this
machine allows (:func:`isolation`), which is such a run. See the ``atgrpo.sandbox`` docstring."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from . import seccomp
from .confine import (_CLONE_NEWNET, _CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWUSER, _SYS_PIVOT_ROOT, _UIDS,
                      INIT_SCRIPT, Isolation, _child_main, _ChildPlan, mountpoint)
from .process import _communicate, _env, _killer, _open_init, _Pipe, _program_returncode, _workspace
from .root import package_binds, root_spec

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
    packages: tuple[str, ...] = ()   # installed top-level packages the program may import (read-only)


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


def _rlimits(limits: Limits, timeout: float) -> tuple[tuple[int, int, int], ...]:
    cpu = limits.cpu_seconds or math.ceil(timeout) + 1
    mem, fsize = limits.memory_mb << 20, limits.file_size_mb << 20
    return ((resource.RLIMIT_CPU, cpu, cpu + 1),  # soft: SIGXCPU, hard: SIGKILL
            (resource.RLIMIT_AS, mem, mem),
            (resource.RLIMIT_FSIZE, fsize, fsize),
            (resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes),
            (resource.RLIMIT_CORE, 0, 0))


def _unshare_flags(iso: Isolation, limits: Limits) -> int:
    if not iso.namespaces:
        return 0
    flags = _CLONE_NEWNS | _CLONE_NEWPID | (_CLONE_NEWUSER if iso.mode == "userns" else 0)
    return flags | (_CLONE_NEWNET if iso.network and not limits.network else 0)


@functools.cache
def _filter() -> seccomp.Prepared | None:
    prog = seccomp.filter_program()
    return None if prog is None else seccomp.Prepared(prog)


def _probe_run(iso: Isolation) -> str:
    """'' if ``print(1)`` runs under ``iso``, else what went wrong (used by :func:`isolation`)."""
    res = _run("print(1)", "", 30.0, Limits(), iso)
    return "" if res.ok and res.stdout == "1\n" else f"exit {res.exit_code}: {res.stderr.strip()[-300:]}"


@contextlib.contextmanager
def _explained(status_pipe: _Pipe):
    """Turn Popen's bare "Exception occurred in preexec_fn" into the reason the child wrote."""
    try:
        yield
    except subprocess.SubprocessError as e:
        os.set_blocking(status_pipe.r, False)
        try:
            why = os.read(status_pipe.r, 600)
        except BlockingIOError:
            why = b""
        reason = why[2:].split(b"\n")[0].decode(errors="replace") if why.startswith(b"E:") else str(e)
        raise RuntimeError(f"atgrpo.sandbox: setting up the sandbox failed: {reason}") from e


def _run(code: str, stdin: str, timeout: float, limits: Limits, iso: Isolation) -> ExecResult:
    confined = iso.namespaces
    spec = root_spec() if confined else None
    uid = _UIDS.acquire() if iso.mode == "root" else None
    try:
        with _workspace(code, confined) as workdir, _Pipe() as pid_pipe, _Pipe() as status_pipe:
            plan = _ChildPlan(workdir, code.encode("utf-8", "surrogateescape"), uid, (os.getuid(), os.getgid()),
                              _rlimits(limits, timeout), _unshare_flags(iso, limits), iso.mode == "userns",
                              spec, package_binds(tuple(limits.packages)) if confined and limits.packages else (),
                              mountpoint() if confined else "", limits.file_size_mb,
                              _filter() if iso.seccomp else None, pid_pipe.w, status_pipe.w)
            args = ([spec.shell, "-c", INIT_SCRIPT, "sh", spec.python, "-I", "main.py"] if confined
                    else [sys.executable, "-I", "main.py"])
            start = time.monotonic()
            popen = functools.partial(subprocess.Popen, args, cwd=None if confined else workdir, env=_env(workdir),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True, preexec_fn=functools.partial(_child_main, plan))
            with _explained(status_pipe), popen() as proc:
                pid_pipe.close_write()
                status_pipe.close_write()
                init_fd = _open_init(proc, pid_pipe.r) if confined else None
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
            returncode = _program_returncode(proc, status_pipe.r, confined)
    finally:
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


def _probe(mode: str, network: bool) -> str:
    """Run ``print(1)`` the way ``mode`` would; '' if it works, else why not."""
    try:
        return _probe_run(Isolation(mode, network, True))
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


@functools.cache
def isolation() -> Isolation:
    """Probe (once) what this machine lets the sandbox do: as root, mount/PID/network namespaces and a
    per-run uid; otherwise the same through an unprivileged user namespace."""
    if seccomp.filter_program() is None or _SYS_PIVOT_ROOT is None:
        return Isolation("none", False, False, f"no system-call filter for {platform.machine()}")
    mode = "root" if os.geteuid() == 0 else "userns"
    why = _probe(mode, network=True)
    if not why:
        return Isolation(mode, True, True)
    if not _probe(mode, network=False):
        return Isolation(mode, False, True)
    return Isolation("none", False, True, f"{'namespaces' if mode == 'root' else 'user namespaces'}: {why}")
