"""Files and directories that are either whole or absent: a directory is written under a temporary name, its
manifest (every file's size and sha256) last, everything fsynced, then renamed into place (one atomic rename on
POSIX); a file is replaced the same way. ``verify_dir`` checks a directory against its manifest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from typing import Callable

MANIFEST_FILE = "manifest.json"
TMP_PREFIX = ".tmp-"  # a crashed write leaves only names with this prefix (removed by the next run)
FORMAT = 1


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(os.path.join(dirpath, name))
        _fsync_path(dirpath)


def temporary_name(parent: str, base: str) -> str:
    """A fresh name next to ``parent/base`` that readers ignore and the next run removes (``TMP_PREFIX``)."""
    return os.path.join(parent, f"{TMP_PREFIX}{base}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_dir_atomically(final: str, write: Callable[[str], None], at: Callable[[str], None] | None = None) -> None:
    """Run ``write(tmp_dir)``, write its manifest last, fsync everything, then rename ``tmp_dir`` to ``final``
    (replacing it). ``at(stage)`` is called as each stage starts: ``manifest``, ``fsync``, ``rename`` (and
    ``moved-aside`` between the two renames of a replace)."""
    at = at or (lambda stage: None)
    parent, base = os.path.split(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = temporary_name(parent, base)
    os.mkdir(tmp)
    old = None
    try:
        write(tmp)
        at("manifest")
        write_manifest(tmp)
        at("fsync")
        _fsync_tree(tmp)
        at("rename")
        if os.path.exists(final):  # replace: move the old one aside first (a dir cannot be renamed onto one)
            old = temporary_name(parent, base + "-old")
            os.rename(final, old)
            at("moved-aside")
        os.rename(tmp, final)
        _fsync_path(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.exists(final):  # failed between the two renames: the old one back
            with contextlib.suppress(OSError):
                os.rename(old, final)
        raise
    if old is not None:
        if os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(old)


def atomic_write_text(path: str, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a part."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = temporary_name(parent, os.path.basename(path))
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_path(parent)
    except BaseException:
        with contextlib.suppress(OSError):  # the disk that failed the write may fail this too: the first error counts
            os.remove(tmp)
        raise


# ---- manifests: what a complete directory holds ------------------------------------------------------
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _, filenames in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in filenames]
    return sorted(f for f in out if f != MANIFEST_FILE)


def write_manifest(root: str) -> None:
    """``root/manifest.json``: the size and sha256 of every file under ``root`` (written after all of them)."""
    files = {f: {"size": os.path.getsize(os.path.join(root, f)), "sha256": _sha256(os.path.join(root, f))}
             for f in _files(root)}
    with open(os.path.join(root, MANIFEST_FILE), "w") as f:
        json.dump({"format": FORMAT, "files": files}, f, indent=1)


def verify_dir(root: str) -> str | None:
    """What is wrong with the directory ``root`` by its manifest (the first problem found), or None when every
    listed file has its size and checksum. A directory without a manifest (written before manifests
    existed) is checked when it is loaded."""
    if not os.path.isdir(root):
        return "missing"
    path = os.path.join(root, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            files = json.load(f)["files"]
        assert isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        return f"{MANIFEST_FILE} is unreadable ({type(e).__name__})"
    for name, want in sorted(files.items()):
        p = os.path.join(root, name)
        if not os.path.isfile(p):
            return f"{name} is missing"
        size = os.path.getsize(p)
        if size != want["size"]:
            return f"{name} has {size} bytes, the manifest says {want['size']}"
        if _sha256(p) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None
