"""A damaged run directory resumes from what is intact, and is read as far as it is readable.

One finished 2-step run (checkpoints step_1 and step_2) is copied per case; a file of the newest checkpoint is
damaged (truncated, emptied, garbled, one byte changed, deleted); ``atgrpo train --resume`` must skip that
checkpoint with a warning naming it, continue from step_1, and write exactly the rows of the undamaged run. When
every checkpoint is damaged: one clear error, exit 2. Torn and garbled lines of the JSON-lines files (what a
crash mid-write leaves) never stop ``atgrpo report`` or ``atgrpo.runs.load``: they skip them and say so.
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


def _empty(path):
    open(path, "w").close()


def _garble(path):
    """The same size, other bytes (a disk that returned junk)."""
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(bytes((i * 131 + 17) % 256 for i in range(size)))


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
    ("weights zero-length", WEIGHTS, _empty, "model.safetensors"),
    ("optimizer and RNG state zero-length", ck.STATE_FILE, _empty, ck.STATE_FILE),
    ("optimizer and RNG state garbled", ck.STATE_FILE, _garble, ck.STATE_FILE),
    ("progress JSON garbled", ck.PROGRESS_FILE, _garble, ck.PROGRESS_FILE),
    ("manifest garbled", MANIFEST_FILE, _garble, MANIFEST_FILE),
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


def test_a_checkpoint_without_its_manifest_that_loads_is_resumed_from(run, base, capsys):
    """A missing manifest alone (an older atgrpo's checkpoint) is no damage: the checkpoint is checked by loading,
    loads, and the run continues from it."""
    os.remove(os.path.join(run, "checkpoint", "step_2", MANIFEST_FILE))
    capsys.readouterr()
    assert main(["train", "--resume", run, "train.steps=3", "--quiet"]) == 0
    assert "damaged" not in capsys.readouterr().err
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 3]
    assert _rows(run)[:2] == _rows(base)[:2]


def test_torn_and_garbled_lines_never_stop_the_report_or_the_reader(run, capsys):
    """A crash mid-write tears the last line of a JSON-lines file; a damaged disk garbles one: ``runs.load`` and
    ``atgrpo report`` read every other line and say, in one warning line, what they skipped."""
    from atgrpo import runs

    rows = _rows(run)
    for rel in ("metrics.jsonl", "eval_transcripts.jsonl", os.path.join("rollouts", "step_2.jsonl")):
        with open(os.path.join(run, rel), "ab") as f:
            f.write(b'{"step": 3, "loss/pg": 0.1')  # torn: no end, no newline
    with open(os.path.join(run, "rollouts", "step_1.jsonl"), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xfe\x00garbled")  # the first line garbled
    _truncate(os.path.join(run, "summary.json"))
    record = runs.load(run)
    assert [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in record.metrics] == [
        {**rows[0]}, {**rows[1], **rows[2]}]  # the steps' rows, the final evaluation merged into step 2
    assert record.summary is None and len(record.transcripts) == 6  # eval.problems=6: every full line
    assert record.trees(1) and record.trees(2)
    assert record.skipped_lines == {"metrics.jsonl": 1, "eval_transcripts.jsonl": 1, "summary.json": 1,
                                    "rollouts/step_1.jsonl": 1, "rollouts/step_2.jsonl": 1}
    capsys.readouterr()
    assert main(["report", run, "--out", os.path.join(run, "r.html")]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"atgrpo: warning: {run}: skipped what could not be read: 1 line(s) of eval_transcripts.jsonl, "
                   f"1 line(s) of metrics.jsonl, 1 line(s) of rollouts/step_1.jsonl, 1 line(s) of "
                   f"rollouts/step_2.jsonl, summary.json (unreadable)"], err


def test_a_report_that_cannot_be_written_is_one_line(run, capsys):
    """``atgrpo report --out`` onto a directory (and so a full disk): exit 2, one line naming the file and the cause."""
    out = os.path.join(run, "taken")
    os.makedirs(os.path.join(out, "something"))
    capsys.readouterr()
    assert main(["report", run, "--out", out]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"atgrpo: error: could not write {out} (Is a directory): move away what is in the way at {out}"]
