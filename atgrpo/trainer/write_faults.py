"""A file of a run that cannot be written: what the fault was, and the one line that stops the run.

Every file a run writes goes through ``stop_on_write_error`` (its result: the run stops, exit 2) or
``warn_on_write_error`` (a view that can be made again: a warning, the run goes on); docs/reliability.md,
"Write faults", lists each file and why. A write fault is told from a bug by ``io_fault``: an ``OSError`` (a full
disk, an I/O error, a read-only file system, a directory where a file should be), a library's error that wraps one
(safetensors: ``... (os error 28)``), or torch's serializer failing to write (``[enforce fail at
inline_container.cc:672] . unexpected pos ...``: a ``RuntimeError``; writing to a Python file object, the
``OSError`` that started it is its context, else the errno is lost and the free space of the disk decides whether
the line says it is full). Anything else is raised as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from typing import Iterator

from .run_dir import RunError, one_line, warn

_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_TORCH_WRITER = re.compile(r"inline_container\.cc|PytorchStreamWriter|file write failed")
FULL_BELOW = 64 * 1024 * 1024  # bytes free under which a failed torch write is put down to a full disk


class RunWriteError(RunError):
    """A file of the run could not be written (a full disk, an I/O error, a read-only directory, a directory in
    its place); what was written before is intact. Exit status 2; the line says what to do."""


def io_fault(e: BaseException, path: str | None = None) -> tuple[int | None, str] | None:
    """(errno or None, the cause in words) of an I/O failure, or None for anything else (a bug). ``path``: where
    the write went (for torch's errors, whose disk is then looked at)."""
    if isinstance(e, OSError):
        return e.errno, e.strerror or one_line(e)
    m = _OS_ERROR.search(str(e))
    if m:
        return int(m.group(1)), os.strerror(int(m.group(1)))
    if isinstance(e, RuntimeError) and _TORCH_WRITER.search(str(e)):
        inner = e.__cause__ or e.__context__  # a file object's OSError, which torch's clean-up then masked
        if isinstance(inner, OSError):
            return inner.errno, inner.strerror or one_line(inner)
        free = free_bytes(path) if path else None
        torch_said = f"torch's writer failed: {' '.join(str(e).split())[:160]}"
        if free is not None and free < FULL_BELOW:
            return errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free / 2**20:.1f} MiB free; {torch_said}"
        return None, f"{torch_said}; the disk may be full or failing"
    return None


def free_bytes(path: str) -> int | None:
    """Bytes free for this user on the file system of ``path`` (its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def remedy(code: int | None, path: str) -> str:
    """What to do about a write fault of ``path``, by its errno."""
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "make room on its disk"
    if code == errno.EROFS:
        return f"make the file system of {os.path.dirname(path) or '.'} writable"
    if code in (errno.EACCES, errno.EPERM):
        return f"make {os.path.dirname(path) or '.'} writable for this user"
    if code in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY):
        return f"move away what is in the way at {path}"
    return "check the disk (an I/O error: see dmesg)" if code == errno.EIO else "check the disk"


def _resume_hint(run_dir: str) -> str:
    from .checkpoint import latest_checkpoint

    last = latest_checkpoint(run_dir)
    return (f"the checkpoint {last.path} is intact" if last else "there is no checkpoint yet (the resume starts the "
            "run over)")


@contextlib.contextmanager
def stop_on_write_error(path: str, run_dir: str, where: str, why: str = "", kept: bool = True) -> Iterator[None]:
    """Turn a write fault of ``path`` in the block into one ``RunWriteError`` line: the file, the cause, where the
    run stopped (``where``: "at step 2"), ``why`` it stops rather than going on (for a log), what is intact and
    what to do. ``kept``: the run directory stays (else: the run failed in its set-up and left nothing)."""
    try:
        yield
    except Exception as e:
        fault = io_fault(e, path)
        if fault is None:
            raise
        code, cause = fault
        tail = (f"{_resume_hint(run_dir)}: {remedy(code, path)}, then continue with: atgrpo train --resume {run_dir}"
                if kept else f"nothing of the run was kept: {remedy(code, path)}, then start it again")
        raise RunWriteError(f"could not write {path} ({cause}); the run stopped {where}{why}; {tail}") from e


@contextlib.contextmanager
def warn_on_write_error(path: str, why: str) -> Iterator[None]:
    """A write fault of ``path`` in the block is a warning (the file, the cause, ``why`` the run goes on)."""
    try:
        yield
    except Exception as e:
        fault = io_fault(e, path)
        if fault is None:
            raise
        warn(f"atgrpo: warning: could not write {path} ({fault[1]}); the run goes on: {why}")
