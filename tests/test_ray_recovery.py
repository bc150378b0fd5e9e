"""Recovery without a person (``system.ray.max_failures``, atgrpo/trainer/recovery.py) on a local 2-CPU Ray
instance: real runs (``train``) whose rollout or update worker is SIGKILLed in the middle of its work (a forward
hook armed through Ray, ``ray_helpers.die_in_forward``) rebuild their pools, go back to the last checkpoint, redo
the steps since, and write exactly the rows of an undisturbed run (also when the worker dies as a checkpoint
begins: the workers write no file, the driver pulls their optimizer states and writes it); past ``max_failures``
the run stops with one line naming the worker, the cause and the checkpoint; a killed driver continues with
``--resume``.

One Ray instance for the module; every run starts its own workers (1 policy x (1 rollout + 2 update) + 1
environment worker, 1/8 CPU each).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from atgrpo.cli import main  # noqa: E402
from atgrpo.config import load_config  # noqa: E402
from atgrpo.trainer import checkpoint as ck  # noqa: E402
from atgrpo.trainer.run import train  # noqa: E402

from conftest import FAST  # noqa: E402
from ray_helpers import RAY, before_step, kill_worker, run_rows  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 4 steps, a checkpoint every 2: a fault in step 4 goes back to step 2 and redoes steps 3 and 4
RUN = FAST + RAY + ["train.steps=4", "train.checkpoint_every=2", "eval.problems=2", "system.ray.num_env_workers=1",
                    "system.ray.num_update_workers=2"]
FSDP = RUN + ["system.ray.update_sharding=fsdp"]


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


_UNDISTURBED: dict = {}


def undisturbed(items, tmp_path_factory) -> str:
    """The run directory of an undisturbed run of ``items`` (once per module and config)."""
    key = tuple(items)
    if key not in _UNDISTURBED:
        out = str(tmp_path_factory.mktemp("undisturbed") / "run")
        train(load_config(None, list(items)), out, progress=False)
        _UNDISTURBED[key] = out
    return _UNDISTURBED[key]


def _same_run(out: str, ref: str) -> None:
    """The recovered run wrote what the undisturbed one wrote: rows (timings aside), rollouts, evaluations."""
    assert run_rows(out) == run_rows(ref)
    assert [r["step"] for r in run_rows(out)] == [1, 2, 3, 4, 4]  # four steps, then the final evaluation
    for f in ("rollouts/step_4.jsonl", "eval_transcripts.jsonl"):
        assert open(os.path.join(out, f)).read() == open(os.path.join(ref, f)).read(), f


def _recovered_once(out: str, summary: dict, worker: str) -> None:
    [rec] = summary["recoveries"]
    assert (rec["failed_step"], rec["restored_step"], rec["worker"]) == (4, 2, worker), rec
    assert rec["seconds_lost"] > 0
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"ray/recoveries"' in line]
    assert [r["ray/recoveries"] for r in rows] == [0, 0, 1, 1]  # the redone steps come after the recovery
    assert rows[2]["time/ray_recovery_lost"] == rec["seconds_lost"]


@pytest.mark.parametrize("kind, index, worker", [
    pytest.param("rollout", 0, "rollout worker 0 of policy 'shared'", marks=pytest.mark.slow),
    ("update", 1, "update worker 1 of policy 'shared'")])
def test_a_worker_killed_mid_work_is_recovered_and_the_run_equals_an_undisturbed_one(
        cluster, tmp_path, tmp_path_factory, monkeypatch, capsys, kind, index, worker):
    ref = undisturbed(RUN, tmp_path_factory)
    out, pids = str(tmp_path / "run"), []
    before_step(monkeypatch, 4, lambda state: pids.append(kill_worker(state.backend, "shared", kind, index)))
    summary = train(load_config(None, RUN), out, progress=False)
    assert pids, "the fault was not armed"
    _recovered_once(out, summary, worker)
    err = capsys.readouterr().err
    assert f"atgrpo: Ray: recovery 1 of system.ray.max_failures=3: {worker} died at step 4" in err, err
    _same_run(out, ref)


@pytest.mark.slow
def test_an_fsdp_rank_killed_mid_update_is_recovered(cluster, tmp_path, tmp_path_factory, monkeypatch):
    ref = undisturbed(FSDP, tmp_path_factory)
    out = str(tmp_path / "run")
    before_step(monkeypatch, 4, lambda state: kill_worker(state.backend, "shared", "update", 1))
    summary = train(load_config(None, FSDP), out, progress=False)
    _recovered_once(out, summary, "update worker 1 of policy 'shared'")
    _same_run(out, ref)


def test_an_update_worker_killed_inside_a_checkpoint_is_recovered(cluster, tmp_path, tmp_path_factory, monkeypatch):
    """Step 4's checkpoint starts by pulling the optimizer states from rank 0 of the update workers; that worker is
    SIGKILLed as the checkpoint begins: the pull fails, nothing of step 4's checkpoint is written, the run
    recovers from step 2 and ends as an undisturbed run."""
    from atgrpo.trainer.ray.driver import RayBackend

    ref = undisturbed(RUN, tmp_path_factory)
    out, real, killed = str(tmp_path / "run"), RayBackend.pull_state, []

    def pull_state(self, state):
        if state.step == 4 and not killed:
            worker = self.pools["shared"].update[0]
            pid = ray.get(worker.__ray_call__.remote(lambda w: os.getpid()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return real(self, state)
    monkeypatch.setattr(RayBackend, "pull_state", pull_state)
    summary = train(load_config(None, RUN), out, progress=False)
    assert killed, "the worker was not killed"
    [rec] = summary["recoveries"]
    assert (rec["failed_step"], rec["restored_step"], rec["worker"]) == (4, 2, "update worker 0 of policy 'shared'")
    _same_run(out, ref)


@pytest.mark.slow
def test_past_max_failures_the_run_stops_with_one_line(cluster, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    before_step(monkeypatch, 2, lambda state: kill_worker(state.backend, "shared", "update", 0))
    rc = main(["train", *RUN, "system.ray.max_failures=0", "--out", out, "--quiet"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 4 and len(lines) == 1, lines
    ckpt = os.path.join(out, "checkpoint", "step_0")  # written before the first step, for recoveries
    assert lines[0].startswith("atgrpo: error: stopped at step 2: update worker 0 of policy 'shared' died "
                               "(ActorDiedError: its worker process has died"), lines[0]
    assert f"system.ray.max_failures=0; resume from {ckpt} with: atgrpo train --resume {out}" in lines[0]
    assert [c.step for c in ck.list_checkpoints(out)] == [0]


@pytest.mark.slow
def test_a_killed_driver_continues_with_resume(cluster, tmp_path, tmp_path_factory):
    """The driver (a real ``atgrpo train`` process on the running cluster) is SIGKILLed after step 3's row; its
    workers go with it (Ray ends a dead driver's actors); ``--resume`` continues from step 2."""
    items = RUN + [f"system.ray.address={cluster}"]
    ref = undisturbed(RUN, tmp_path_factory)
    out = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "atgrpo.cli", "train", *items, "--out", out, "--quiet"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(out, "metrics.jsonl")) or \
            sum(1 for _ in open(os.path.join(out, "metrics.jsonl"))) < 3:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert ck.latest_checkpoint(out).step == 2
    deadline = time.time() + 120  # Ray ends the dead driver's workers: their CPUs come back to the cluster
    while ray.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == 2, ray.available_resources()
    assert main(["train", "--resume", out, "--quiet"]) == 0
    assert run_rows(out) == run_rows(ref)


def test_lost_workers_are_told_from_bugs():
    """A dead worker is recovered from; an error raised in a worker's code (its constructor included) is not."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from atgrpo.trainer.ray.faults import lost_cause

    assert lost_cause(ActorDiedError()) == "ActorDiedError: The actor died unexpectedly before finishing this task."
    assert lost_cause(RayTaskError("update", "Traceback ...", ValueError("a bug"))) is None
    assert lost_cause(ActorDiedError(RayTaskError("__init__", "Traceback ...", ValueError("bad model")))) is None
    assert lost_cause(RuntimeError("gloo: connection closed by peer")) is None
