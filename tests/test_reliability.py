"""Reliability: checkpoints, exact resume after SIGKILL, clean stop on SIGINT, the run-directory lock,
non-finite updates, bad input, and flat memory over a long run."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from atgrpo.cli import main
from atgrpo.config import ConfigError, load_config
from atgrpo.trainer import checkpoint as ck
from atgrpo.trainer.run_dir import RunDirInUse, RunLock
from atgrpo.trainer import state as state_module
from atgrpo.trainer.state import build_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESUME = ["train.steps=4", "train.checkpoint_every=1"]


def _rows(run_dir):
    """metrics.jsonl without the keys that measure time and memory (they differ between any two runs)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
                for line in f if line.strip()]


def _n_rows(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "atgrpo.cli", "train", *args, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_rows(proc, run_dir, n, timeout=180.0):
    deadline = time.time() + timeout
    while _n_rows(run_dir) < n:
        assert proc.poll() is None, f"the run ended before {n} rows: {proc.communicate()[1][-2000:]}"
        assert time.time() < deadline, f"no {n} metrics rows after {timeout}s"
        time.sleep(0.05)


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


_REFERENCE = {}


@pytest.fixture
def reference(tmp_path_factory, fast_overrides):
    """An uninterrupted 4-step run (in this process; run once per session, on first use)."""
    def get():
        if "dir" not in _REFERENCE:
            out = str(tmp_path_factory.mktemp("reference") / "run")
            assert main(["train", *fast_overrides, *RESUME, "--out", out, "--quiet"]) == 0
            _REFERENCE["dir"] = out
        return _REFERENCE["dir"]
    return get


# ---- exact resume -------------------------------------------------------------------------------------
def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_rows(tmp_path, fast_overrides, reference):
    out = str(tmp_path / "run")
    proc = _cli(*fast_overrides, *RESUME, "--out", out)
    errors = []

    def kill_at_two_rows():
        try:
            _wait_rows(proc, out, 2)
            proc.send_signal(signal.SIGKILL)  # mid step 3 or mid checkpoint 2: no chance to clean up
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            proc.kill()
    killer = threading.Thread(target=kill_at_two_rows)
    killer.start()
    ref = reference()  # meanwhile, the uninterrupted run (another process, the same seed)
    killer.join()
    proc.communicate()
    assert not errors, errors
    assert proc.returncode == -signal.SIGKILL
    assert 1 <= ck.latest_checkpoint(out).step < 4 and not os.path.exists(os.path.join(out, "summary.json"))
    assert main(["train", "--resume", out, "--quiet"]) == 0
    assert _rows(out) == _rows(ref)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4, 4]  # four steps, then the final evaluation
    for f in ("rollouts/step_4.jsonl", "eval_transcripts.jsonl"):
        assert open(os.path.join(out, f)).read() == open(os.path.join(ref, f)).read(), f
    left = os.listdir(os.path.join(out, "checkpoint"))
    assert sorted(left) == ["final", "step_3", "step_4"], left  # keep_checkpoints=2, no .tmp leftovers


def test_a_crash_before_the_first_scheduled_checkpoint_resumes_without_a_second_warm_start(
        tmp_path, fast_overrides, reference, monkeypatch):
    import atgrpo.trainer.run as run_module
    from fault_helpers import before_step

    ref = reference()  # first: it warm-starts too
    out, calls, real = str(tmp_path / "run"), [], run_module.warm_start
    monkeypatch.setattr(run_module, "warm_start", lambda *a: calls.append(1) or real(*a))

    def crash(state):
        raise RuntimeError("the machine went away")
    before_step(monkeypatch, 2, crash)  # step 1 ran; its checkpoint was not due (every 4)
    assert main(["train", *fast_overrides, "train.steps=4", "train.checkpoint_every=4", "--out", out,
                 "--quiet"]) == 1
    assert sorted(os.listdir(os.path.join(out, "checkpoint"))) == ["step_0"]
    assert main(["train", "--resume", out, "--quiet"]) == 0
    assert len(calls) == 1  # the resume started from step_0: warm start and first evaluation kept
    assert _rows(out) == _rows(ref)


def test_sigint_stops_after_the_step_with_a_checkpoint(tmp_path, fast_overrides):
    out = str(tmp_path / "run")
    proc = _cli(*fast_overrides, "train.steps=6", "train.checkpoint_every=5", "--out", out)
    _wait_rows(proc, out, 1)
    proc.send_signal(signal.SIGINT)
    rc, _, err = _finish(proc)
    assert rc == 130, err[-3000:]
    assert "--resume" in err and "Traceback" not in err
    n = _n_rows(out)
    assert 1 <= n < 6
    assert ck.latest_checkpoint(out).step == n  # the step it stopped after: an unscheduled checkpoint
    assert not os.path.exists(os.path.join(out, "summary.json"))
    with RunLock(out) as lock:  # released
        assert lock.previous_owner is None  # the lock file was emptied on the way out


def test_a_signal_in_the_warm_start_says_where_it_stops_and_keeps_the_warm_start(tmp_path, fast_overrides,
                                                                                 reference, monkeypatch, capsys):
    """A warm start and the first evaluation run for minutes without a step boundary: a stop asked for there says
    it will come after them, and the step-0 checkpoint keeps them, so a resume does not warm-start again."""
    import atgrpo.trainer.run as run_module

    ref = reference()  # first: it warm-starts too
    out, real = str(tmp_path / "run"), run_module.warm_start

    def signalled(*a):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only raises a flag; the warm start goes on
        return real(*a)
    monkeypatch.setattr(run_module, "warm_start", signalled)
    assert main(["train", *fast_overrides, *RESUME, "--out", out, "--quiet"]) == 130
    assert "stopping after the warm start and the evaluation before RL" in capsys.readouterr().err
    assert ck.latest_checkpoint(out).step == 0
    monkeypatch.setattr(run_module, "warm_start", lambda *a: pytest.fail("the resume warm-started again"))
    assert main(["train", "--resume", out, "--quiet"]) == 0
    assert _rows(out) == _rows(ref)


def test_extending_a_finished_run_equals_the_longer_run(tmp_path, fast_overrides, reference, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *fast_overrides, "train.checkpoint_every=1", "--out", out, "--quiet"]) == 0  # 2 steps
    assert main(["train", "--resume", out, "--quiet"]) == 0  # already finished: nothing to do
    assert main(["train", *fast_overrides, "--out", out, "--quiet"]) == 2  # a fresh run never overwrites a run
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--resume", out, "rollout.K=2"]) == 2  # a resumed run keeps its config
    assert "only train.steps" in capsys.readouterr().err
    assert main(["train", "--resume", out, "train.steps=4", "--quiet"]) == 0
    assert _rows(out) == _rows(reference())  # the eval row of the 2-step end was dropped with the extension
    assert load_config(os.path.join(out, "config.yaml")).train.steps == 4


def test_a_finished_run_without_its_checkpoints_is_never_started_over(tmp_path, fast_overrides, capsys):
    """The real-results bench removes a finished cell's checkpoints; resuming that directory again must return the
    finished run, not warm-start a new one over its metrics (it once did, and emptied metrics.jsonl)."""
    import shutil

    out = str(tmp_path / "run")
    assert main(["train", *fast_overrides, "train.checkpoint_every=1", "--out", out, "--quiet"]) == 0
    shutil.rmtree(os.path.join(out, "checkpoint"))
    rows = _rows(out)
    assert main(["train", "--resume", out]) == 0
    assert "already finished at step 2 (its checkpoints were removed)" in capsys.readouterr().out
    assert _rows(out) == rows and rows
    assert main(["train", "--resume", out, "train.steps=4"]) == 2
    assert "no checkpoint to continue from" in capsys.readouterr().err
    assert _rows(out) == rows


def test_a_resume_under_a_changed_config_says_so_and_keeps_the_old_config(tmp_path, fast_overrides, capsys):
    """The CLI resumes a run under its own config; a program calling the trainer itself may pass another one. The
    run then holds two recipes: the warning names the changed keys, and the first config stays beside the new."""
    from atgrpo.trainer.run import train

    out = str(tmp_path / "run")
    assert main(["train", *fast_overrides, "train.steps=1", "train.checkpoint_every=1", "--out", out, "--quiet"]) == 0
    lr = load_config(os.path.join(out, "config.yaml")).algo.lr
    capsys.readouterr()
    train(load_config(None, fast_overrides + ["train.steps=2", "train.checkpoint_every=1"]), out, progress=False,
          resume=True)  # extending the run is no change
    assert "changed config" not in capsys.readouterr().err
    assert not [f for f in os.listdir(out) if f.startswith("config.step_")]
    changed = ["train.steps=3", "train.checkpoint_every=1", f"algo.lr={lr * 2}", "rollout.K=2"]
    train(load_config(None, fast_overrides + changed), out, progress=False, resume=True)
    err = capsys.readouterr().err
    assert "resuming" in err and "at step 2 under a changed config (algo.lr, rollout.K)" in err, err
    assert load_config(os.path.join(out, "config.step_2.yaml")).algo.lr == lr
    assert load_config(os.path.join(out, "config.yaml")).algo.lr == lr * 2


def test_resume_errors_are_clear(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path), "configs/quickstart.yaml"]) == 2
    assert "no config file" in capsys.readouterr().err


# ---- checkpoints --------------------------------------------------------------------------------------
def _touch_optimizers(state):
    for pid, policy in state.policies.items():
        loss = sum(p.float().pow(2).sum() for p in policy.model.parameters())
        loss.backward()
        state.optimizers[pid].step()
        state.optimizers[pid].zero_grad()


def test_checkpoint_round_trip_prune_and_crash_mid_write(tmp_path, fast_overrides, monkeypatch):
    cfg = load_config(None, fast_overrides + ["policy.sharing=L3"])
    run = str(tmp_path)
    state = build_state(cfg)
    for step in (1, 2, 3):
        _touch_optimizers(state)
        state.step = step
        torch.randint(0, 100, (3,), generator=state.generator)
        ck.save_checkpoint(run, state, {"rows": [{"step": step}], "nonfinite": 0}, keep=2)
    assert [c.step for c in ck.list_checkpoints(run)] == [2, 3]
    expect = {"gen": torch.randint(0, 10**6, (4,), generator=state.generator).tolist(), "py": random.random(),
              "torch": torch.rand(2).tolist()}

    fresh = build_state(cfg)
    prog = ck.load_checkpoint(ck.latest_checkpoint(run), fresh)
    assert prog["step"] == 3 and prog["rows"] == [{"step": 3}] and fresh.step == 3
    for pid in state.policies:
        a, b = state.policies[pid].model.state_dict(), fresh.policies[pid].model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), pid
        sa, sb = state.optimizers[pid].state_dict()["state"], fresh.optimizers[pid].state_dict()["state"]
        assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]), pid
    got = {"gen": torch.randint(0, 10**6, (4,), generator=fresh.generator).tolist(), "py": random.random(),
           "torch": torch.rand(2).tolist()}
    assert got == expect  # every RNG continues where the saved run left off
    # transformers can load a checkpointed policy
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(os.path.join(run, "checkpoint", "step_3", "tool")) is not None

    # a crash in the middle of writing step 4 leaves step 3 intact and no partial directory
    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(ck.torch, "save", boom)
    state.step = 4
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(run, state, {"rows": []}, keep=2)
    assert [c.step for c in ck.list_checkpoints(run)] == [2, 3]
    assert not [n for n in os.listdir(os.path.join(run, "checkpoint")) if n.startswith(".tmp")]
    # a SIGKILL mid-write leaves a .tmp directory: ignored, and removed by the next run
    junk = os.path.join(run, "checkpoint", ".tmp-step_5-1-abcd")
    os.makedirs(os.path.join(junk, "tool"))
    open(os.path.join(junk, ck.PROGRESS_FILE), "w").write("{")
    assert ck.latest_checkpoint(run).step == 3
    ck.remove_leftovers(run)
    assert not os.path.exists(junk)


# ---- the run-directory lock ---------------------------------------------------------------------------
def test_a_run_directory_in_use_is_refused(tmp_path, fast_overrides, capsys):
    out = str(tmp_path / "run")
    with RunLock(out):
        assert main(["train", *fast_overrides, "--out", out, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "in use by another atgrpo run" in err and f"pid {os.getpid()}" in err
        with pytest.raises(RunDirInUse):
            RunLock(out).acquire()
    assert not os.path.exists(os.path.join(out, "config.yaml"))  # refused before any work


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(tmp_path / ".lock", "w") as f:
        f.write(f"{dead.pid}\n")
    with RunLock(str(tmp_path)) as lock:
        assert lock.previous_owner == str(dead.pid)
        assert open(tmp_path / ".lock").read().strip() == str(os.getpid())


# ---- bad input and non-finite updates -----------------------------------------------------------------
def test_missing_model_path_is_named_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "model.kind=hf", "model.path=/no/such/model-dir", "--out", str(out)]) == 2
    assert "/no/such/model-dir" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("item, key", [("train.checkpoint_every=-1", "train.checkpoint_every"),
                                       ("train.checkpoint_every=1.5", "train.checkpoint_every"),
                                       ("train.keep_checkpoints=0", "train.keep_checkpoints"),
                                       ("train.max_nonfinite=0", "train.max_nonfinite")])
def test_reliability_settings_are_validated(item, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [item])


def test_nonfinite_updates_are_skipped_logged_and_stop_the_run(tmp_path, fast_overrides, monkeypatch, capsys):
    real = state_module.build_policies

    def nan_when_training(module, inputs, output):  # logits with gradients (the update) become NaN;
        return output * float("nan") if torch.is_grad_enabled() else output  # sampling is untouched

    def build_policies(*a, **k):
        policies = real(*a, **k)
        for p in policies.values():
            p.model.get_output_embeddings().register_forward_hook(nan_when_training)
        return policies
    monkeypatch.setattr(state_module, "build_policies", build_policies)
    out = str(tmp_path / "run")
    rc = main(["train", *fast_overrides, "warmstart.enabled=false", "train.steps=5", "train.checkpoint_every=1",
               "train.max_nonfinite=3", "--out", out, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "non-finite" in err and "train.max_nonfinite=3" in err and "step_1" in err
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]  # 2 mini-batches a step, each skipped: 4 >= 3 at step 2
    assert [r["update/shared/skipped_nonfinite"] for r in rows] == [2.0, 2.0]
    assert [r["update/skipped_nonfinite_total"] for r in rows] == [2.0, 4.0]
    assert all(r["update/shared/optimizer_steps"] == 0 for r in rows)
    assert not os.path.exists(os.path.join(out, "summary.json"))


# ---- long runs ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_memory_stays_flat_over_a_long_run(tmp_path, fast_overrides):
    out = str(tmp_path / "run")
    assert main(["train", *fast_overrides, "warmstart.enabled=false", "eval.problems=2", "train.steps=24",
                 "train.checkpoint_every=4", "train.dump_rollouts=[1,8,16,24]", "--out", out, "--quiet"]) == 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rss = [r["perf/rss_mb"] for r in map(json.loads, f) if "perf/rss_mb" in r]
    assert len(rss) == 24
    growth = max(rss[8:]) - rss[7]  # after warm-up (allocator pools, first checkpoints)
    assert growth < 40, f"RSS grew by {growth:.1f} MiB over 16 steps: {[round(x) for x in rss]}"
