"""Checkpoints and exact resume, the run-directory lock, and stop-on-signal.

Layout under ``RUN_DIR/checkpoint/``:

    step_<N>/               everything needed to continue exactly after step N
      <policy>/             the model (``save_pretrained``: ``from_pretrained`` loads it) + atgrpo_policy.json
      trainer_state.pt      optimizer states; RNG states (python, numpy, torch CPU/CUDA, the loop's generator)
      progress.json         step, the metrics rows so far, eval history, eval_before, warm-start flag and
                            losses, the non-finite update count
    reference/<policy>/     the frozen KL reference (only with algo.kl_coef > 0), written once after warm start
    final/<policy>/         the trained policies at the end (what ``atgrpo eval RUN_DIR`` loads)

Every checkpoint directory is written into a ``.tmp-*`` directory next to it, then ``manifest.json`` (every
file's size and sha256) is written last, every file fsynced, and the directory renamed into place: one rename is
atomic on POSIX, so a crash mid-write leaves the previous checkpoints intact and a ``.tmp-*`` leftover that is
ignored and removed by the next run on the directory. Only the newest ``train.keep_checkpoints`` step
checkpoints are kept.

On resume the checkpoints are verified newest first against their manifests (and then loaded); a damaged one
(a truncated, changed or missing file) is skipped with a warning naming it and moved aside to
``damaged-step_<N>``, and the run continues from the newest intact one. When none is intact, ``ResumeError``
lists what is wrong with each.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from .step import TrainState

CHECKPOINT_DIR = "checkpoint"
MANIFEST_FILE = "manifest.json"
DAMAGED_PREFIX = "damaged-"
STATE_FILE = "trainer_state.pt"
PROGRESS_FILE = "progress.json"
LOCK_FILE = ".lock"
TMP_PREFIX = ".tmp-"
FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


class RunError(RuntimeError):
    """A run cannot start or continue; the message says why and what to do."""


class RunDirInUse(RunError):
    """Another live process holds the run directory's lock (or the directory already holds a run)."""


class ResumeError(RunError):
    """The run directory cannot be resumed (no config, a checkpoint that does not fit the config)."""


# ---- atomic files and directories ---------------------------------------------------------------------
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


def _tmp_name(parent: str, base: str) -> str:
    return os.path.join(parent, f"{TMP_PREFIX}{base}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_dir_atomically(final: str, write: Callable[[str], None]) -> None:
    """Run ``write(tmp_dir)``, write its manifest last, fsync everything, then rename ``tmp_dir`` to ``final``
    (replacing it)."""
    parent, base = os.path.split(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = _tmp_name(parent, base)
    os.mkdir(tmp)
    try:
        write(tmp)
        write_manifest(tmp)
        _fsync_tree(tmp)
        if os.path.exists(final):  # replace: move the old one aside first (a dir cannot be renamed onto one)
            old = _tmp_name(parent, base + "-old")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_path(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a part."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = _tmp_name(parent, os.path.basename(path))
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_path(parent)
    except BaseException:
        if os.path.exists(tmp):
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


def remove_leftovers(run_dir: str) -> None:
    """Remove ``.tmp-*`` leftovers of a crashed write (call only while holding the run's lock)."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    for parent in (run_dir, root):
        if os.path.isdir(parent):
            for name in os.listdir(parent):
                if name.startswith(TMP_PREFIX):
                    p = os.path.join(parent, name)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


# ---- policies -----------------------------------------------------------------------------------------
def save_policies(state: "TrainState", path: str) -> None:
    """Every policy in transformers format under ``path/<policy>/`` (not atomic: see ``write_dir_atomically``)."""
    with _no_hf_progress_bars():
        for pid, policy in state.policies.items():
            _save_one(state, pid, policy, os.path.join(path, pid))


@contextlib.contextmanager
def _no_hf_progress_bars():
    """No "Writing model shards" bar at every checkpoint."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save_one(state: "TrainState", pid: str, policy, d: str) -> None:
    policy.model.save_pretrained(d)  # L2: the role's adapter in peft's format (policies/lora.py)
    if hasattr(policy.tokenizer, "save_pretrained"):  # HF tokenizers (with the chat template); not ByteTokenizer
        policy.tokenizer.save_pretrained(d)
    with open(os.path.join(d, "atgrpo_policy.json"), "w") as f:
        json.dump({"policy": pid, "tokenizer": type(policy.tokenizer).__name__,
                   "agents": [a for a, p in state.agent_to_policy.items() if p == pid]}, f, indent=1)


def load_model_weights(model: torch.nn.Module, path: str) -> None:
    """Load the weights ``save_pretrained`` wrote in ``path`` into ``model`` in place (exact bits).

    Reads the safetensors files directly (no second model in memory); weights tied to a loaded one (e.g. the
    LM head tied to the embeddings, which ``save_pretrained`` leaves out) count as loaded. Falls back to
    ``from_pretrained`` when the saved names differ from the model's own."""
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) if os.path.isdir(path) else []
    if files:
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(os.path.join(path, f), device="cpu"))
        own = model.state_dict()
        if set(sd) <= set(own):
            loaded = {own[k].data_ptr() for k in sd}
            if all(own[k].data_ptr() in loaded for k in own if k not in sd):
                model.load_state_dict(sd, strict=False)
                return
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ResumeError(f"no saved model in {path} (expected config.json and *.safetensors)")
    from transformers import AutoModelForCausalLM

    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path).state_dict())


def save_references(run_dir: str, state: "TrainState") -> None:
    """The frozen KL references, once (they never change during the run)."""
    def write(tmp: str) -> None:
        with _no_hf_progress_bars():
            for pid, ref in state.references.items():
                ref.model.save_pretrained(os.path.join(tmp, pid))
    write_dir_atomically(os.path.join(run_dir, CHECKPOINT_DIR, "reference"), write)


def load_references(run_dir: str, state: "TrainState") -> dict:
    path = os.path.join(run_dir, CHECKPOINT_DIR, "reference")
    problem = verify_dir(path) if os.path.isdir(path) else None
    if problem:
        raise ResumeError(f"the saved KL reference policies in {path} are damaged ({problem}); they cannot be "
                          f"rebuilt, so this run cannot continue: start it again in another --out")
    refs = {}
    for pid, policy in state.policies.items():
        if not os.path.isdir(os.path.join(path, pid)):
            raise ResumeError(f"algo.kl_coef > 0 but there is no saved reference policy at {path}/{pid}")
        refs[pid] = copy.deepcopy(policy)
        load_model_weights(refs[pid].model, os.path.join(path, pid))
    return refs


# ---- RNG ----------------------------------------------------------------------------------------------
def rng_states(generator: torch.Generator) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    st = {"python": random.getstate(), "torch": torch.get_rng_state(), "generator": generator.get_state(),
          "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_states(st: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(_as_tuple(st["python"]))
    torch.set_rng_state(st["torch"])
    generator.set_state(st["generator"])
    name, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---- step checkpoints ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str


def list_checkpoints(run_dir: str) -> list[Checkpoint]:
    """The complete step checkpoints of a run, oldest first."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, PROGRESS_FILE)) and os.path.isfile(os.path.join(path, STATE_FILE)):
            out.append(Checkpoint(int(m.group(1)), path))
    return sorted(out, key=lambda c: c.step)


def latest_checkpoint(run_dir: str) -> Checkpoint | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(run_dir: str, state: "TrainState", progress: dict[str, Any], keep: int) -> str:
    """Write ``checkpoint/step_<state.step>`` atomically, then drop all but the newest ``keep``."""
    path = os.path.join(run_dir, CHECKPOINT_DIR, f"step_{state.step}")

    def write(tmp: str) -> None:
        save_policies(state, tmp)
        torch.save({"format": FORMAT, "step": state.step,
                    "optimizers": {pid: opt.state_dict() for pid, opt in state.optimizers.items()},
                    "rng": rng_states(state.generator)}, os.path.join(tmp, STATE_FILE))
        with open(os.path.join(tmp, PROGRESS_FILE), "w") as f:
            json.dump({"format": FORMAT, **progress, "step": state.step}, f)

    write_dir_atomically(path, write)
    ckpts = list_checkpoints(run_dir)
    for old in ckpts[:max(0, len(ckpts) - keep)]:
        trash = _tmp_name(os.path.dirname(old.path), os.path.basename(old.path) + "-drop")
        os.rename(old.path, trash)  # renamed first: a half-deleted checkpoint never looks complete
        shutil.rmtree(trash, ignore_errors=True)
    return path


def step_dirs(run_dir: str) -> list[Checkpoint]:
    """Every ``step_<N>`` directory of a run, newest first, complete or not (``list_checkpoints``: complete)."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    out = [Checkpoint(int(m.group(1)), os.path.join(root, n)) for n in os.listdir(root) if (m := _STEP_DIR.match(n))]
    return sorted(out, key=lambda c: -c.step)


def one_line(e: BaseException) -> str:
    """An exception as one line of at most ~400 characters: its type and its message."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}" if text else type(e).__name__


def restore_newest_intact(run_dir: str, state: "TrainState",
                          warn: Callable[[str], None] | None = None) -> tuple[Checkpoint, dict[str, Any]] | None:
    """Load the newest intact step checkpoint into ``state``; return it and its progress, or None when the run
    has no checkpoint. Each checkpoint is verified against its manifest, then loaded; a damaged one is skipped
    (``warn`` gets a line naming it and why) and moved aside to ``damaged-step_<N>``. Raises ``ResumeError`` when
    there are checkpoints but none is intact."""
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    damaged: list[tuple[Checkpoint, str]] = []
    for ckpt in step_dirs(run_dir):
        problem = verify_dir(ckpt.path)
        if problem is None:
            try:
                progress = load_checkpoint(ckpt, state)
            except Exception as e:  # no manifest (an older run), or contents that do not load
                problem = one_line(e)
        if problem is not None:
            damaged.append((ckpt, problem))
            continue
        for bad, why in damaged:
            aside = _aside_name(bad.path)
            os.rename(bad.path, aside)
            warn(f"atgrpo: warning: checkpoint {bad.path} is damaged ({why}); skipped it and moved it to {aside}")
        if damaged:
            warn(f"atgrpo: warning: resuming from {ckpt.path}, the newest intact checkpoint")
        return ckpt, progress
    if damaged:
        root = os.path.join(run_dir, CHECKPOINT_DIR)
        raise ResumeError(f"no intact checkpoint in {root}: " + "; ".join(
            f"{os.path.basename(c.path)}: {why}" for c, why in damaged) + ". To start this run again from the "
            f"beginning, move {root} aside and resume again, or start a new run with another --out")
    return None


def _aside_name(path: str) -> str:
    parent, base = os.path.split(path)
    out, n = os.path.join(parent, DAMAGED_PREFIX + base), 1
    while os.path.exists(out):
        n += 1
        out = os.path.join(parent, f"{DAMAGED_PREFIX}{base}-{n}")
    return out


def load_checkpoint(ckpt: Checkpoint, state: "TrainState") -> dict[str, Any]:
    """Restore policies, optimizers, RNG states and the step counter into ``state``; return the progress."""
    with open(os.path.join(ckpt.path, PROGRESS_FILE)) as f:
        progress = json.load(f)
    blob = torch.load(os.path.join(ckpt.path, STATE_FILE), map_location="cpu", weights_only=True)
    if set(blob["optimizers"]) != set(state.optimizers):
        raise ResumeError(f"checkpoint {ckpt.path} holds policies {sorted(blob['optimizers'])}, the config "
                          f"builds {sorted(state.optimizers)}")
    for pid, policy in state.policies.items():
        load_model_weights(policy.model, os.path.join(ckpt.path, pid))
        state.optimizers[pid].load_state_dict(blob["optimizers"][pid])
    set_rng_states(blob["rng"], state.generator)
    state.step = int(blob["step"])
    return progress


# ---- the run-directory lock ---------------------------------------------------------------------------
class RunLock:
    """An exclusive lock on a run directory for the life of a run.

    ``RUN_DIR/.lock`` holds the owner's pid; the lock itself is ``fcntl.flock`` on the open file, which the
    kernel releases when the process dies, so the lock file of a dead (killed) run is simply taken over.
    (flock is advisory and may not work across machines on some network file systems.)"""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK_FILE)
        self.previous_owner: str | None = None  # pid written by a dead run whose lock was taken over
        self._f = None

    def acquire(self) -> "RunLock":
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            f = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
        except OSError as e:  # a path through a file, no permission, a read-only or full disk
            raise RunError(f"cannot create the run directory {self.run_dir} ({e.strerror or e}); choose another "
                           f"--out") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                f.close()
                raise
            owner = f.read().strip() or "unknown"
            f.close()
            raise RunDirInUse(f"run directory {self.run_dir} is in use by another atgrpo run (pid {owner}; lock "
                              f"{self.path}); wait for it to finish or stop it, or choose another --out") from None
        prev = f.read().strip()
        self.previous_owner = prev if prev and prev != str(os.getpid()) else None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._f = f
        return self

    def release(self) -> None:
        if self._f is not None:
            self._f.seek(0)
            self._f.truncate()  # the file stays (deleting it would race with a waiting acquirer)
            fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            self._f.close()
            self._f = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ---- stop on SIGINT / SIGTERM -------------------------------------------------------------------------
class StopOnSignal:
    """SIGINT (Ctrl-C) and SIGTERM ask the run to stop after the current step: the handler only sets a flag
    that the runner checks between steps, so the stop happens at a clean point, after a checkpoint. A second
    signal of the same kind gets the previous handler (Ctrl-C twice: KeyboardInterrupt at once). Installed
    only in the main thread (Python delivers signals there); elsewhere the flag never rises."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        signal.signal(signum, self._previous[signum])  # a second signal: the previous behaviour
        print(f"\natgrpo: {signal.Signals(signum).name} received: stopping after this step with a checkpoint "
              f"(send it again to abort at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                prev = signal.signal(s, self._handle)
                self._previous[s] = prev if prev is not None else signal.SIG_DFL
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
