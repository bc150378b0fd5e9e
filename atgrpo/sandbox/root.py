"""What goes into a program's minimal root: worked out once per process, mounted per run.

The root is an empty tmpfs holding only
  * the interpreter (the real binary behind ``sys.executable``, so no virtual environment and none of
    its site-packages) and ``/bin/sh`` (the namespace's init, and ``subprocess(shell=True)``);
  * the directories holding the shared libraries that they and the standard library's extension
    modules load (from ``ldd``, e.g. ``/usr/lib/x86_64-linux-gnu``), and ``/etc/ld.so.cache``;
  * the interpreter's ``lib`` directory (standard library, ``libpython``), with every site-packages
    directory in it covered by an empty read-only tmpfs, into which the packages a run declares
    (``Limits.packages``) are bound;
  * ``/dev/{null,zero,full,random,urandom}``, a fresh ``/proc``, a private size-limited ``/tmp``
    holding the working directory, ``/dev/shm`` as a link to it.
Everything bound in is read-only; symlinks on the way to a bound path (``/lib64 -> usr/lib64``) are
recreated so that paths compiled into binaries (the ELF interpreter) still resolve. Nothing else of the
host exists there: no /home, /root, /etc/passwd, repository, run directory or dataset file.

:func:`root_spec` computes the plan (a few ``stat`` calls and one ``ldd``); ``confine`` replays it.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

_DEVICES = ("null", "zero", "full", "random", "urandom")
_ST_FLAGS = 2 | 4 | 8  # ST_NOSUID | ST_NODEV | ST_NOEXEC == MS_NOSUID | MS_NODEV | MS_NOEXEC
_MULTIARCH_DIR = re.compile(r"/lib(32|64)?/[a-z0-9_]+-linux-gnu[a-z0-9_]*$")  # e.g. /usr/lib/x86_64-linux-gnu


@dataclass(frozen=True)
class Bind:
    src: str            # host path (real)
    dst: str            # path in the root
    is_dir: bool
    flags: int          # mount flags of the source that a read-only remount must keep (locked in a user ns)


@dataclass(frozen=True)
class RootSpec:
    python: str                         # the interpreter, by its real path (same path inside)
    shell: str                          # real path of /bin/sh
    dirs: tuple[str, ...]               # to create, parents first
    links: tuple[tuple[str, str], ...]  # (path, target) symlinks to recreate
    binds: tuple[Bind, ...]             # read-only bind mounts, outer before inner
    covers: tuple[str, ...]             # site-packages directories (the first gets the declared packages)
    masks: tuple[str, ...]              # covers inside a bound directory: hidden under an empty tmpfs


def _mount_flags(path: str) -> int:
    return os.statvfs(path).f_flag & _ST_FLAGS


def _resolve(path: str, links: dict[str, str]) -> str:
    """``realpath(path)``, recording every symlink met on the way (as path -> target).

    ``.`` and ``..`` are resolved as the kernel does, against the real directory reached so far: a relative
    target such as Ubuntu 24.04's ``/usr/lib64/ld-linux-x86-64.so.2 -> ../lib/x86_64-linux-gnu/...`` must
    not leave ``/usr/lib64/..`` in a path that the root then tries to create."""
    parts, done, hops = [p for p in path.split("/") if p], "", 0
    while parts:
        part = parts.pop(0)
        if part in (".", ".."):
            done = os.path.dirname(done) if part == ".." and done else done
            continue
        cur = f"{done}/{part}"
        if os.path.islink(cur):
            target = os.readlink(cur)
            links[cur] = target
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks resolving {path}")
            parts = [p for p in target.split("/") if p] + parts
            done = "" if target.startswith("/") else done
        else:
            done = cur
    return done or "/"


def _ldd(files: list[str]) -> list[str]:
    """Library paths (as the loader names them) needed by ``files``, per ``ldd``."""
    ldd = shutil.which("ldd", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if ldd is None:
        raise RuntimeError("atgrpo.sandbox: `ldd` not found; cannot work out the interpreter's libraries")
    out = subprocess.run([ldd, *files], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout
    return sorted({m for m in re.findall(r"(?:=>\s*|^\s*)(/\S+)\s+\(0x", out, re.M)})


def _site_dirs(lib_dir: str) -> list[str]:
    """site-packages / dist-packages directories inside the interpreter's lib directory."""
    found = glob.glob(os.path.join(lib_dir, "python3*", "site-packages")) + \
        glob.glob(os.path.join(lib_dir, "python3*", "dist-packages"))
    return sorted(os.path.realpath(d) for d in found if os.path.isdir(d))


def _inside(path: str, dirs) -> bool:
    return any(path.startswith(d + "/") for d in dirs)


def _site_covers(candidates: set[str], bound: list[str]) -> set[str]:
    """The site-packages directories of the bare interpreter that the root can hold: those that exist here,
    and missing ones outside a bound directory (made empty in the root). A missing one inside a bound, read-only
    directory cannot be made and is not on the interpreter's path there either: under a virtual environment
    sysconfig names ``/usr/lib/python3.12/site-packages``, which Ubuntu's interpreter neither has nor uses (its
    ``site`` adds ``/usr/local/lib/python3.12/dist-packages`` and ``/usr/lib/python3/dist-packages``)."""
    return {p for p in candidates if os.path.isdir(p) or not _inside(p, bound)}


@functools.cache
def root_spec() -> RootSpec:
    """The minimal root for this interpreter (computed once per process)."""
    links: dict[str, str] = {}
    python = _resolve(getattr(sys, "_base_executable", None) or sys.executable, links)
    shell = _resolve("/bin/sh", links)
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    stdlibs = [_resolve(sysconfig.get_path(k, vars=base), links) for k in ("stdlib", "platstdlib")]
    dynload = glob.glob(os.path.join(stdlibs[1], "lib-dynload", "*.so"))
    binds: dict[str, bool] = {python: False, shell: False, **{d: True for d in stdlibs}}
    for lib in _ldd([python, shell, *dynload]):
        real = _resolve(lib, links)
        parent = os.path.dirname(real)
        binds[parent if _MULTIARCH_DIR.search(parent) else real] = _MULTIARCH_DIR.search(parent) is not None
    for extra in ("/etc/ld.so.cache", *(f"/dev/{d}" for d in _DEVICES)):
        if os.path.exists(extra):
            binds[_resolve(extra, links)] = os.path.isdir(extra)
    bound = [p for p, is_dir in binds.items() if is_dir]
    binds = {p: d for p, d in binds.items() if not _inside(p, bound)}
    bound = [p for p, is_dir in binds.items() if is_dir]
    links = {p: t for p, t in links.items() if not _inside(p, bound)}
    candidates = [sysconfig.get_path(k, vars=base) for k in ("purelib", "platlib")]
    candidates += site.getsitepackages([sys.base_prefix, sys.base_exec_prefix])
    covers = sorted(_site_covers({_resolve(p, links) for p in candidates}, bound) |
                    {os.path.realpath(p) for d in stdlibs for p in glob.glob(f"{d}/*-packages") if os.path.isdir(p)})
    dirs: set[str] = set()
    for path in [*(os.path.dirname(p) for p in [*binds, *links]), *(p for p, d in binds.items() if d),
                 *covers, "/proc", "/tmp", "/dev"]:
        while path not in ("", "/") and not _inside(path, bound):
            dirs.add(path)  # ancestors of resolved paths are real directories
            path = os.path.dirname(path)
    links.setdefault("/dev/shm", "/tmp")
    return RootSpec(python=python, shell=shell, dirs=tuple(sorted(dirs)), links=tuple(sorted(links.items())),
                    binds=tuple(Bind(p, p, d, _mount_flags(p)) for p, d in sorted(binds.items())),
                    covers=tuple(covers), masks=tuple(c for c in covers if _inside(c, bound)))


@functools.cache
def package_binds(packages: tuple[str, ...]) -> tuple[Bind, ...]:
    """Read-only binds that put the declared top-level packages (and their ``<name>.libs``) into the
    root's site-packages, where the interpreter's ``site`` finds them."""
    covers = root_spec().covers
    if not covers:
        raise RuntimeError("atgrpo.sandbox: the interpreter has no site-packages directory to put packages in")
    binds = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations:
            raise ValueError(f"atgrpo.sandbox: package {name!r} (Limits.packages) is not installed here")
        src = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
        for path in (src, f"{src}.libs" if os.path.isdir(src) else ""):
            if path and os.path.exists(path):
                real = os.path.realpath(path)
                binds.append(Bind(real, os.path.join(covers[0], os.path.basename(path)), os.path.isdir(real),
                                  _mount_flags(real)))
    return tuple(binds)
