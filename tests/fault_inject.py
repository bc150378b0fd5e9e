"""Write faults injected into a run in this process, at one file of its run directory (``WriteFault``).

A file is named by its logical path in the run directory: the ``.tmp-*`` names of atomic writes are read as the
names they become (``checkpoint/.tmp-step_2-123-ab12cd34/trainer_state.pt`` is ``checkpoint/step_2/trainer_state.pt``),
so a pattern names the file, however it is written. Once armed, the first matching write operation fails:

    ENOSPC  a full disk: the file is created, a write past its first 64 bytes raises ``OSError(ENOSPC)``;
            safetensors raises the error it raises on a real full disk (``... No space left on device (os error
            28)``); ``mkdir`` and ``rename`` raise ENOSPC
    torch   a full disk as torch's serializer reports it: ``torch.save`` writes the file by its path under a file
            size limit (``RLIMIT_FSIZE``) that makes its write fail for real, and torch raises its own
            ``RuntimeError`` (``[enforce fail at inline_container.cc:...] . unexpected pos ...``)
    EIO     an I/O error: as ENOSPC, with ``OSError(EIO)``
    EROFS   a read-only directory: ``OSError(EROFS)`` where the file is opened (or created, or renamed)
    EISDIR  a directory in the file's place: nothing is injected; the test puts a real directory there, and the
            kernel's error is the fault

``op`` chooses the operation: ``write`` (``open`` for writing, ``torch.save``, safetensors), ``mkdir`` or ``rename``
(``os.rename`` / ``os.replace`` onto the file). When the fault strikes (injected or real), the run directory is
recorded (``before``): what the run had written until then, to compare with what is left after it stopped.
(/dev/full would give the kernel's own ENOSPC, but not every machine has it: the test VMs do not.)
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fnmatch
import os
import re
import resource
import signal

ERRNO = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EROFS": errno.EROFS}
_TMP = re.compile(r"^\.tmp-(.+)-\d+-[0-9a-f]{8}$")


def logical(path, root: str) -> str | None:
    """``path`` relative to ``root`` with ``.tmp-*`` names read as the names they become; None outside ``root``."""
    rel = os.path.relpath(os.path.abspath(os.fspath(path)), root)
    if rel == ".." or rel.startswith(".." + os.sep):
        return None
    return "/".join(_TMP.sub(r"\1", part) for part in rel.split(os.sep))


def snapshot(root: str) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes, but the lock and ``.tmp-*`` leftovers."""
    out = {}
    for parent, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".tmp-")]
        for n in names:
            p = os.path.join(parent, n)
            if n != ".lock" and not n.startswith(".tmp-") and os.path.isfile(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = f.read()
    return out


class WriteFault:
    """The fault ``fault`` at the first ``op`` on a file of ``root`` matching ``pattern`` once ``arm()`` is called."""

    def __init__(self, monkeypatch, root: str, pattern: str, fault: str, op: str = "write"):
        self.root, self.pattern, self.fault, self.op = os.path.abspath(root), pattern, fault, op
        self.armed, self.struck, self.before = False, [], None
        self._patch(monkeypatch)

    def arm(self) -> None:
        self.armed = True

    def _hit(self, path, op: str, faults=("ENOSPC", "EIO", "EROFS", "EISDIR")) -> bool:
        if not self.armed or self.struck or op != self.op or self.fault not in faults:
            return False
        if not isinstance(path, (str, os.PathLike)):
            return False
        name = logical(path, self.root)
        return name is not None and fnmatch.fnmatch(name, self.pattern)

    def _strike(self, path) -> None:
        """The fault strikes at ``path`` (for EISDIR: the real operation that fails is about to run)."""
        self.struck.append(logical(path, self.root))
        self.before = snapshot(self.root)

    def _error(self, path, *more) -> OSError:
        code = ERRNO[self.fault]
        return OSError(code, os.strerror(code), os.fspath(path), *more)

    def _patch(self, mp) -> None:
        import safetensors
        import torch
        import transformers.modeling_utils as mu

        real_open, real_mkdir, real_rename, real_replace = builtins.open, os.mkdir, os.rename, os.replace
        real_save, real_st = torch.save, mu.safe_save_file

        def open_(file, mode="r", *a, **k):
            if any(c in mode for c in "wax+") and self._hit(file, "write"):
                self._strike(file)
                if self.fault in ("ENOSPC", "EIO"):  # created; the data cannot be written
                    return _FailingWrites(real_open(file, mode, *a, **k), self._error(file))
                if self.fault == "EROFS":
                    raise self._error(file)
            return real_open(file, mode, *a, **k)

        def mkdir(path, *a, **k):
            if not os.path.exists(path) and self._hit(path, "mkdir", tuple(ERRNO)):
                self._strike(path)
                raise self._error(path)
            return real_mkdir(path, *a, **k)

        def renamer(real):
            def rename(src, dst, *a, **k):
                if self._hit(dst, "rename", tuple(ERRNO)):
                    self._strike(dst)
                    raise self._error(src, os.fspath(dst))
                return real(src, dst, *a, **k)
            return rename

        def save(obj, f, *a, **k):
            name = getattr(f, "name", f)
            if self._hit(name, "write", ("torch",)):
                self._strike(name)
                with _file_size_limit(1024):  # torch's own RuntimeError, from a write that really fails
                    return real_save(obj, os.fspath(name), *a, **k)
            return real_save(obj, f, *a, **k)

        def safe_save_file(tensors, filename, *a, **k):
            if self._hit(filename, "write", tuple(ERRNO)):
                self._strike(filename)
                code = ERRNO[self.fault]
                raise safetensors.SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} "
                                                  f"(os error {code})")
            return real_st(tensors, filename, *a, **k)

        mp.setattr(builtins, "open", open_)
        mp.setattr(os, "mkdir", mkdir)
        mp.setattr(os, "rename", renamer(real_rename))
        mp.setattr(os, "replace", renamer(real_replace))
        mp.setattr(torch, "save", save)
        mp.setattr(mu, "safe_save_file", safe_save_file)


class _FailingWrites:
    """A file open for writing whose writes raise ``error`` once ``room`` bytes are written (the disk filled, or
    failed, part of the way through: torch then masks the error with its own, as it does on a real full disk)."""

    def __init__(self, f, error: OSError, room: int = 64):
        self._f, self._error, self._room = f, error, room

    def write(self, data):
        if len(data) > self._room:
            raise self._error
        self._room -= len(data)
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@contextlib.contextmanager
def _file_size_limit(size: int):
    """Writes past ``size`` bytes fail (EFBIG) in this process for the block (SIGXFSZ ignored meanwhile)."""
    old, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
