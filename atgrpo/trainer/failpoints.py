"""Named points a run passes (``failpoint("checkpoint.rename", step)``), where a test can make the process crash.

Test-only in effect: nothing happens unless the environment variable ``ATGRPO_FAILPOINT`` is set, and then the
cost is one dictionary look-up per point (a few dozen per step). Its value is ``<point>@<step>[:<action>]``:

    kill    (the default) SIGKILL this process there, as an OOM kill or a power loss would: no clean-up at all
    term    send SIGTERM to this process there: the graceful stop (the run stops after the current step)

e.g. ``ATGRPO_FAILPOINT=checkpoint.manifest@2`` kills the run while it writes step 2's checkpoint, after every
other file of it and before its manifest. ``ATGRPO_FAILPOINT=trace:FILE`` instead appends ``<point>@<step>``
to FILE at every point passed: the list a test picks its crash points from (``tests/test_kill_points.py``).

The points, in the order a run passes them: ``run.warmstarted@0``, the stages of ``reference.<stage>@0`` (with
``algo.kl_coef > 0``) and ``run.evaluated@0`` (a fresh run); per step N ``step.start``, ``step.logged`` (its metrics
row written), ``step.rollouts`` (its rollouts dumped, when they are), ``step.eval`` (its held-out evaluation
written, when one is due); per checkpoint of step N (step 0 too) ``checkpoint.<stage>`` as each stage of
``save_checkpoint`` starts (``checkpoint.CHECKPOINT_STAGES``: ``policies``, ``trainer_state``, ``progress``,
``manifest``, ``fsync``, ``rename``, ``moved-aside``, ``prune``, ``dropping``, ``done``); at the end ``final.<stage>``
(the final policies' directory: ``manifest``, ``fsync``, ``rename``, ``moved-aside``), ``run.transcripts``,
``run.summary`` (summary.json written) and ``run.end``.
"""

from __future__ import annotations

import os
import signal

ENV = "ATGRPO_FAILPOINT"


def failpoint(point: str, step: int) -> None:
    """Pass the point ``point`` of step ``step``: act if ``ATGRPO_FAILPOINT`` names it (see the module docstring)."""
    spec = os.environ.get(ENV)
    if spec:
        _act(spec, point, step)


def _act(spec: str, point: str, step: int) -> None:
    if spec.startswith("trace:"):
        with open(spec[len("trace:"):], "a") as f:
            f.write(f"{point}@{step}\n")
        return
    where, _, action = spec.partition(":")
    if where != f"{point}@{step}":
        return
    if action in ("", "kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        raise ValueError(f"{ENV}={spec!r}: the action must be kill or term")
