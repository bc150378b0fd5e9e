"""Telling a lost worker from a bug: the Ray errors that mean a rollout or update worker (its process or its
node) is gone, and ``gather``, which waits on a pool's calls and turns such an error into ``WorkerLost`` naming
the worker. The run (``trainer/run.py``) recovers from ``WorkerLost`` (docs/ray.md, "Recovery"); any other error
is raised as it is. This module's top level imports neither torch nor ray."""

from __future__ import annotations

from typing import Sequence

PEER_GRACE_S = 60.0  # after a rank's error, how long to wait for its peers' (a dead peer's error explains it;
# Ray declares a vanished node dead after tens of seconds of missed health checks by default)


class WorkerLost(RuntimeError):
    """A rollout or update worker died (a crashed or killed process, a node that left): its pool cannot go on.
    ``worker`` names it (e.g. "update worker 1 of policy 'shared'"), ``cause`` says why, in one line."""

    def __init__(self, worker: str, cause: str):
        super().__init__(f"{worker} died ({cause})")
        self.worker, self.cause = worker, cause


def lost_cause(e: BaseException) -> str | None:
    """One line on why a worker is gone, when ``e`` says one is (its actor died, its process crashed, its node
    left, an object it held was lost); None for any other error (a bug: not to be retried)."""
    from ray import exceptions as rx

    kinds = tuple(getattr(rx, n) for n in ("RayActorError", "WorkerCrashedError", "NodeDiedError",
                                            "ObjectLostError", "OwnerDiedError", "ActorUnavailableError")
                  if hasattr(rx, n))
    text = " ".join(str(e).split())
    if not isinstance(e, kinds) or getattr(e, "actor_init_failed", False) or "creation task" in text:
        return None  # a worker whose constructor raised: a bug, not a loss
    return f"{type(e).__name__}: {_why(text)}"


def _why(text: str) -> str:
    """The telling parts of Ray's many-line death message: why the actor is dead, the exit detail, the pid."""
    import re

    parts = [m.group(1) for m in (re.search(r"dead because (.+?)\.(?: |$)", text),
                                  re.search(r"exit detail: (.+?)\.(?: |$)", text)) if m]
    where = [f"{k} {m.group(1)}" for k, m in (("pid", re.search(r"\bpid: (\d+)", text)),
                                              ("ip", re.search(r"\bip: ([\w.:-]+)", text))) if m]
    return "; ".join(parts + where) if parts else text[:200]


def gather(refs: Sequence, names: Sequence[str]) -> list:
    """``ray.get(refs)``, but an error is raised as soon as one call fails: ``WorkerLost`` (naming
    ``names[i]``) when a worker is gone. A call that failed otherwise while a peer died (a collective whose
    other rank vanished) is blamed on the dead peer, after waiting up to ``PEER_GRACE_S`` for its error."""
    import ray

    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except Exception as e:
            cause = lost_cause(e)
            if cause is not None:
                raise WorkerLost(names[index[done[0]]], cause) from e
            if pending:
                others, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_GRACE_S)
                for ref in others:
                    try:
                        ray.get(ref)
                    except Exception as peer:
                        if (c := lost_cause(peer)) is not None:
                            raise WorkerLost(names[index[ref]], c) from peer
            raise
    return ray.get(list(refs))
