"""A damaged run directory resumes from what is intact.

One finished 2-step run (checkpoints step_1 and step_2) is copied per case; a file of the newest checkpoint is
damaged; ``atgrpo train --resume`` must skip that checkpoint with a warning naming it, continue from step_1,
and write exactly the rows of the undamaged run. When every checkpoint is damaged: one clear error, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from atgrpo.cli import main
from atgrpo.trainer import checkpoint as ck
from atgrpo.trainer.atomic_files import MANIFEST_FILE

BASE = ["train.steps=2", "train.checkpoint_every=1", "train.keep_checkpoints=2"]
WEIGHTS = os.path.join("shared", "model.safetensors")  # the one policy of the quickstart (L1) is called shared


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
                for line in f if line.strip()]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from conftest import FAST

    out = str(tmp_path_factory.mktemp("base") / "run")
    assert main(["train", *FAST, *BASE, "--out", out, "--quiet"]) == 0
    assert [c.step for c in ck.list_checkpoints(out)] == [1, 2]
    return out


@pytest.fixture
def run(base, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(base, out)
    return out


def _truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(max(1, int(size * keep)))


def _flip(path, where=0.75):
    """Change one byte: the size stays, the checksum does not."""
    with open(path, "r+b") as f:
        f.seek(int(os.path.getsize(path) * where))
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


def _delete(path):
    os.remove(path)


# (id, file in checkpoint/step_2, damage, what the warning names)
CASES = [
    ("weights truncated", WEIGHTS, _truncate, "model.safetensors"),
    ("weights one byte changed", WEIGHTS, _flip, "model.safetensors"),
    ("optimizer and RNG state truncated", ck.STATE_FILE, _truncate, ck.STATE_FILE),
    ("optimizer and RNG state one byte changed", ck.STATE_FILE, _flip, ck.STATE_FILE),
    ("progress JSON truncated", ck.PROGRESS_FILE, _truncate, ck.PROGRESS_FILE),
    ("model config JSON truncated", os.path.join("shared", "config.json"), _truncate, "config.json"),
    ("policy file deleted", os.path.join("shared", "atgrpo_policy.json"), _delete, "atgrpo_policy.json"),
    ("manifest truncated", MANIFEST_FILE, _truncate, MANIFEST_FILE),
]


@pytest.mark.parametrize("name, rel, damage, named", CASES, ids=[c[0] for c in CASES])
def test_damaged_newest_checkpoint_is_skipped(run, base, capsys, name, rel, damage, named):
    newest = os.path.join(run, "checkpoint", "step_2")
    damage(os.path.join(newest, rel))
    assert ck.verify_dir(newest) is not None
    capsys.readouterr()
    assert main(["train", "--resume", run, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {newest} is damaged" in err and named in err, err
    assert "Traceback" not in err
    assert _rows(run) == _rows(base)  # continued from step_1: step 2 again, the same rows
    for f in ("rollouts/step_2.jsonl", "eval_transcripts.jsonl"):
        assert open(os.path.join(run, f)).read() == open(os.path.join(base, f)).read(), f
    left = sorted(os.listdir(os.path.join(run, "checkpoint")))
    assert left == ["damaged-step_2", "final", "step_1", "step_2"], left  # the damaged one kept aside
    assert ck.verify_dir(newest) is None and ck.verify_dir(os.path.join(run, "checkpoint", "final")) is None


def test_checkpoint_without_manifest_is_checked_by_loading(run, base, capsys):
    """A checkpoint written before manifests existed: a file that does not load marks it damaged."""
    for step in (1, 2):
        os.remove(os.path.join(run, "checkpoint", f"step_{step}", MANIFEST_FILE))
    _truncate(os.path.join(run, "checkpoint", "step_2", ck.STATE_FILE))
    capsys.readouterr()
    assert main(["train", "--resume", run, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "step_2 is damaged" in err and "Traceback" not in err
    assert _rows(run) == _rows(base)


def test_every_checkpoint_damaged_is_one_clear_error(run, capsys):
    for step, rel in ((1, WEIGHTS), (2, ck.PROGRESS_FILE)):
        _truncate(os.path.join(run, "checkpoint", f"step_{step}", rel))
    before = sorted(os.listdir(os.path.join(run, "checkpoint")))
    rows = _rows(run)
    capsys.readouterr()
    assert main(["train", "--resume", run, "--quiet"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("atgrpo: error: no intact checkpoint in")
    for s in (f"step_1: {WEIGHTS} has", "step_2: progress.json has", "move"):
        assert s in err[0], (s, err[0])
    assert sorted(os.listdir(os.path.join(run, "checkpoint"))) == before  # nothing moved or removed
    assert _rows(run) == rows


def test_truncated_summary_does_not_stop_a_resume(run, base, capsys):
    _truncate(os.path.join(run, "summary.json"))
    capsys.readouterr()
    assert main(["train", "--resume", run, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "summary.json is damaged" in err and "Traceback" not in err
    assert _rows(run) == _rows(base)
    summary = json.load(open(os.path.join(run, "summary.json")))  # written again
    assert summary["steps"] == 2 and summary["eval_after"] == json.load(open(os.path.join(base, "summary.json")))[
        "eval_after"]


def test_damaged_final_policies_are_named_by_eval(run, capsys):
    _flip(os.path.join(run, "checkpoint", "final", WEIGHTS))
    capsys.readouterr()
    assert main(["eval", run, "eval.problems=2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint/final" in err[0] and "model.safetensors" in err[0], err


def test_truncated_metrics_line_and_deleted_summary_resume(run, base, capsys):
    path = os.path.join(run, "metrics.jsonl")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[:len(text) - 40])  # the last row cut in the middle, as a kill mid-write leaves it
    os.remove(os.path.join(run, "summary.json"))
    capsys.readouterr()
    assert main(["train", "--resume", run, "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert _rows(run) == _rows(base)
    assert json.load(open(os.path.join(run, "summary.json")))["steps"] == 2
