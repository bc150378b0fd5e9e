"""A run directory's guards: its lock (one live run per directory), the stop-on-signal flag, the config check of a
resume, and the errors a run reports."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import sys
import threading
from typing import Any

LOCK_FILE = ".lock"
RESOLVED_AT_START = ("train.threads", "model.precision")  # chosen per machine when a run starts (run_settings.py)
# How the work is split into micro-batches and when it is saved, not what is computed (the same gradients, up to
# float rounding): a table cell's run resumes, and its result stays current, across changes to these
EXECUTION_ONLY = ("algo.micro_batch_size", "algo.update_token_budget", "warmstart.token_budget",
                  "train.checkpoint_every", "train.tensorboard")


class RunError(RuntimeError):
    """A run cannot start or continue; the message says why and what to do."""


class RunDirInUse(RunError):
    """Another live process holds the run directory's lock (or the directory already holds a run)."""


class ResumeError(RunError):
    """The run directory cannot be resumed (no config, a checkpoint that does not fit the config)."""


def one_line(e: BaseException) -> str:
    """An exception as one line of at most ~400 characters: its type and its message."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}" if text else type(e).__name__


def warn(line: str) -> None:
    """A warning line on stderr, at once."""
    print(line, file=sys.stderr, flush=True)


def config_changes(run_dir: str, cfg: Any, ignore: tuple[str, ...] = RESOLVED_AT_START + EXECUTION_ONLY) -> list[str]:
    """The dotted keys whose value in the run directory's config.yaml differs from ``cfg``'s, besides ``ignore``
    (sorted; empty when the directory has no config.yaml)."""
    import yaml

    from .metrics import flatten

    try:
        with open(os.path.join(run_dir, "config.yaml")) as f:
            saved = flatten(yaml.safe_load(f) or {})
    except FileNotFoundError:
        return []
    now = flatten(cfg.to_dict())
    return sorted(k for k in set(saved) | set(now) if k not in ignore and saved.get(k) != now.get(k))


def key_list(keys: list[str], most: int = 6) -> str:
    """``keys`` for a message: comma-separated, the first ``most`` then ``...``."""
    return ", ".join(keys[:most]) + (", ..." if len(keys) > most else "")


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
    only in the main thread (Python delivers signals there); elsewhere the flag never rises. ``stop_point`` names,
    in the message the signal prints, where the run will stop: a warm start and the evaluation before RL run for
    minutes without a step boundary, and the user should know the wait is expected."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    AFTER_STEP = "this step"

    def __init__(self):
        self.signum: int | None = None
        self.stop_point = self.AFTER_STEP
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        signal.signal(signum, self._previous[signum])  # a second signal: the previous behaviour
        print(f"\natgrpo: {signal.Signals(signum).name} received: stopping after {self.stop_point} with a checkpoint "
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
