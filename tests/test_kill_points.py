"""A real tiny run killed at many points spread over its steps, then resumed: every resume ends with the rows,
rollouts and held-out transcripts of an uninterrupted run (bit-exact on CPU; ``time/*`` and ``perf/*`` aside).

The points are the run's own failpoints (``atgrpo/trainer/failpoints.py``): the uninterrupted run records every
point it passes (``ATGRPO_FAILPOINT=trace:FILE``), inside each checkpoint's write included (after its policies,
its optimizer state, its progress, before and after its manifest, fsync, rename, the drop of an older one). Each
crash is a forked copy of this process running ``atgrpo train`` with ``ATGRPO_FAILPOINT=<point>@<step>:kill``, which
SIGKILLs itself there (no clean-up: a ``.tmp-*`` directory, a half-dropped checkpoint, a step without its
checkpoint are left as a power loss leaves them), or ``:term``, which sends itself SIGTERM (the graceful stop:
exit 130 after a checkpoint, or 0 once the last step is done). Forking skips the seconds of imports a new
interpreter would take (a crash and its resume take about half a second), so the default suite kills the 4-step
run at every point it passes and terminates it at one of each kind; ``-m slow`` kills and terminates a richer run
(two policies, a KL reference, held-out evaluations between steps, a checkpoint every other step) at every point.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from atgrpo.cli import main
from atgrpo.trainer.failpoints import ENV

from conftest import FAST
from fault_helpers import run_rows

RUN = FAST + ["train.steps=4", "train.checkpoint_every=1", "train.threads=1"]
RICH = FAST + ["train.steps=6", "train.checkpoint_every=2", "train.threads=1", "policy.sharing=L3",
               "algo.kl_coef=0.05", "eval.every=2", "eval.problems=2"]
AFTER_LOOP = ("final.", "run.transcripts", "run.summary", "run.end")  # a SIGTERM there lets the run finish
_UNINTERRUPTED: dict = {}


@pytest.fixture
def uninterrupted(tmp_path_factory):
    """``get(items)``: the uninterrupted run of ``items`` and the points it passed, in order (``point@step``);
    one run per item set and session."""
    def get(items: list[str]) -> tuple[str, list[str]]:
        if tuple(items) not in _UNINTERRUPTED:
            root = tmp_path_factory.mktemp("uninterrupted")
            out, trace = str(root / "run"), str(root / "trace")
            os.environ[ENV] = "trace:" + trace
            try:
                assert main(["train", *items, "--out", out, "--quiet"]) == 0
            finally:
                del os.environ[ENV]
            with open(trace) as f:
                points = [line.strip() for line in f if line.strip()]
            assert len(points) == len(set(points)), "a point passed twice at one step"
            _UNINTERRUPTED[tuple(items)] = out, points
        return _UNINTERRUPTED[tuple(items)]
    return get


def spread(points: list[str]) -> list[str]:
    """One occurrence of every distinct point, the k-th of them at its (k mod n)-th step: all stages, all steps."""
    names = list(dict.fromkeys(p.split("@")[0] for p in points))
    occurrences = {n: [p for p in points if p.split("@")[0] == n] for n in names}
    return [occurrences[n][k % len(occurrences[n])] for k, n in enumerate(names)]


def crash(items: list[str], point: str, action: str, out: str, timeout: float = 300.0) -> int:
    """Run ``atgrpo train`` in a forked copy of this process until ``point``'s ``action``; its wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.environ[ENV] = f"{point}:{action}"
            code = main(["train", *items, "--out", out, "--quiet"])
        finally:
            os._exit(code)
    deadline = time.time() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the run crashing at {point} did not end in {timeout:.0f}s")
        time.sleep(0.02)


def _same_run(out: str, ref: str, point: str, action: str) -> None:
    """The resumed run wrote what the uninterrupted one wrote (``point``: where it was crashed, for the message):
    rows, every dumped rollout, the transcripts, summary.json and report.html, the same checkpoints kept (after a
    SIGTERM the same number: its stop wrote one that a checkpoint every N steps would not have)."""
    assert run_rows(out) == run_rows(ref), point
    dumped = sorted(os.listdir(os.path.join(ref, "rollouts")))
    assert sorted(os.listdir(os.path.join(out, "rollouts"))) == dumped, point
    for f in [os.path.join("rollouts", d) for d in dumped] + ["eval_transcripts.jsonl", "eval_transcripts_start.jsonl"]:
        with open(os.path.join(out, f)) as a, open(os.path.join(ref, f)) as b:
            assert a.read() == b.read(), (point, f)
    assert os.path.isfile(os.path.join(out, "summary.json")) and os.path.isfile(os.path.join(out, "report.html"))
    (others, steps), (want_others, want_steps) = (_kept(d) for d in (out, ref))
    assert others == want_others, (point, others)  # no .tmp-* leftover, nothing damaged
    same = steps == want_steps if action == "kill" else (len(steps), steps[-1]) == (len(want_steps), want_steps[-1])
    assert same, (point, steps)


def _kept(run_dir: str) -> tuple[list[str], list[int]]:
    """What checkpoint/ holds: the names that are no step checkpoint, and the steps of those that are."""
    names = os.listdir(os.path.join(run_dir, "checkpoint"))
    return sorted(n for n in names if not n.startswith("step_")), sorted(int(n[5:]) for n in names
                                                                         if n.startswith("step_"))


def crash_and_resume(items: list[str], point: str, action: str, tmp_path, ref: str, capsys) -> None:
    """Crash a run of ``items`` at ``point`` (SIGKILL or SIGTERM), resume it, compare it with ``ref``."""
    out = str(tmp_path / "run")
    status = crash(items, point, action, out)
    if action == "kill":
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (point, status)
    else:
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        assert code == (0 if point.startswith(AFTER_LOOP) else 130), (point, code)
    capsys.readouterr()
    assert main(["train", "--resume", out, "--quiet"]) == 0, (point, capsys.readouterr().err[-2000:])
    _same_run(out, ref, point, action)


def test_the_run_passes_every_checkpoint_stage_at_every_step(uninterrupted):
    _, points = uninterrupted(RUN)
    for step in range(5):
        for stage in ("policies", "trainer_state", "progress", "manifest", "fsync", "rename", "prune", "done"):
            assert f"checkpoint.{stage}@{step}" in points, (stage, step)
    assert {p.split("@")[1] for p in spread(points)} == {"0", "1", "2", "3", "4"}  # spread over all steps


def test_sigkill_at_every_point_then_resume_equals_the_uninterrupted_run(uninterrupted, tmp_path, capsys):
    ref, points = uninterrupted(RUN)
    assert len(points) >= 20, points
    for i, point in enumerate(points):
        crash_and_resume(RUN, point, "kill", tmp_path / str(i), ref, capsys)


def test_sigterm_at_every_kind_of_point_then_resume_equals_the_uninterrupted_run(uninterrupted, tmp_path, capsys):
    ref, points = uninterrupted(RUN)
    for i, point in enumerate(spread(points)):
        crash_and_resume(RUN, point, "term", tmp_path / str(i), ref, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["kill", "term"])
def test_a_richer_run_crashed_at_every_point_resumes_to_the_uninterrupted_run(action, uninterrupted, tmp_path,
                                                                              capsys):
    ref, points = uninterrupted(RICH)
    assert any(p.startswith("reference.") for p in points) and any(p.startswith("step.eval") for p in points)
    for i, point in enumerate(points):
        crash_and_resume(RICH, point, action, tmp_path / str(i), ref, capsys)
