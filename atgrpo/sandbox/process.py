"""The parent's side of a run: working directory, environment, pipes, output capture, killing."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager, suppress
from typing import Iterator



def _env(workdir: str) -> dict[str, str]:
    """A fresh environment; nothing is inherited from ours.

    MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per malloc arena (up to
    8 per core), so under RLIMIT_AS a program with a dozen threads could not start them.
    """
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "MALLOC_ARENA_MAX": "2"}


@contextmanager
def _workspace(code: str, confined: bool) -> Iterator[str]:
    """The program's working directory. Confined, a fresh name in the sandbox's private /tmp (the init
    creates it there and writes ``main.py``; nothing is made on the host); unconfined, a fresh host
    directory holding ``main.py``, removed afterwards."""
    if confined:
        yield f"/tmp/atgrpo-sbx-{os.urandom(6).hex()}"
        return
    workdir = tempfile.mkdtemp(prefix="atgrpo-sbx-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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


def _program_returncode(proc: subprocess.Popen, status_r: int, confined: bool) -> int:
    """Popen-style return code of the program itself (negative: killed by that signal).

    Confined, the outer waiter reports the wait status of the namespace's init, /bin/sh, which exits
    with the program's status: 128 + n when the program was killed by signal n (so a program that
    exits with 129..192 itself reads as killed by a signal)."""
    if not confined:
        return proc.returncode
    os.set_blocking(status_r, False)
    status = b""
    with suppress(BlockingIOError):
        status = os.read(status_r, 4)
    if len(status) < 4:  # the waiter was killed before it could report
        return -signal.SIGKILL
    code = os.waitstatus_to_exitcode(int.from_bytes(status, "little"))
    return -(code - 128) if 128 < code <= 128 + 64 else code


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
