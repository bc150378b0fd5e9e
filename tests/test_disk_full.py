"""A disk that fills while a checkpoint is written (a real 4 MiB tmpfs, mounted as root; skipped otherwise): the
run stops with one line (exit 2) that names the checkpoint, the full disk and the intact previous checkpoint, that
checkpoint loads, nothing the run had written is lost, and once there is room ``--resume`` finishes the run with
the rows of an uninterrupted one. Torch's serializer, given a path on a full disk, reports it as a
``RuntimeError`` without the errno: the line still says the disk is full. And a real read-only ``checkpoint/``
(a read-only bind mount as root, no write permission otherwise): the same one line, the same resume. These are
the real faults; tests/test_write_faults.py injects each fault at each file the run writes."""

import os
import subprocess

import pytest

from atgrpo.cli import main
from atgrpo.config import load_config
from atgrpo.trainer import checkpoint as ck
from atgrpo.trainer.state import build_state

from conftest import FAST
from fault_helpers import before_step, run_rows

ITEMS = FAST + ["warmstart.enabled=false", "train.steps=3", "train.checkpoint_every=1", "eval.problems=2"]
ROOM = 24 * 1024  # bytes left free before step 2: its metrics row fits, its checkpoint (~100 KB) does not


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield str(d)
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for parent, _, names in os.walk(root):
        for n in names:
            p = os.path.join(parent, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def test_a_disk_that_fills_mid_checkpoint_stops_in_one_line_and_loses_nothing(small_disk, tmp_path, monkeypatch,
                                                                                capsys):
    out, filler, seen = os.path.join(small_disk, "run"), os.path.join(small_disk, "filler"), {}

    def fill(state):  # before step 2: what the run wrote so far, then the disk full but for ROOM bytes
        seen.update(_files(out))
        st = os.statvfs(small_disk)
        with open(filler, "wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize - ROOM))
    before_step(monkeypatch, 2, fill)
    rc = main(["train", *ITEMS, "--out", out, "--quiet"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    step1 = os.path.join(out, "checkpoint", "step_1")
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0] == (f"atgrpo: error: could not write the checkpoint {out}/checkpoint/step_2 (the policies' "
                        f"weights and config: No space left on device); the checkpoint {step1} is intact: make "
                        f"room on its disk, then continue with: atgrpo train --resume {out}")
    now = _files(out)
    seen.pop(".lock")  # holds the pid while the run lives, emptied when it ends
    for name, data in seen.items():  # nothing lost: every file as it was (metrics.jsonl only grew)
        assert now[name][:len(data)] == data if name == "metrics.jsonl" else now[name] == data, name
    assert [r["step"] for r in run_rows(out)] == [1, 2]
    assert sorted(os.listdir(os.path.join(out, "checkpoint"))) == ["step_0", "step_1"]  # no .tmp-* left over
    state = build_state(load_config(None, ITEMS))
    ckpt, _ = ck.restore_newest_intact(out, state, warn=pytest.fail)
    assert ckpt.step == 1 and state.step == 1

    os.remove(filler)  # room again: the run continues from step 1 and ends as an uninterrupted run
    assert main(["train", "--resume", out, "--quiet"]) == 0
    ref = str(tmp_path / "ref")
    assert main(["train", *ITEMS, "--out", ref, "--quiet"]) == 0
    assert run_rows(out) == run_rows(ref)


def test_torch_on_a_full_disk_is_named_a_full_disk(small_disk):
    """The issue's error: torch.save to a path on a full disk raises ``RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos ...``; ``io_fault`` tells it from a bug, and by the free space says
    the disk is full. The checkpoint writes through a Python file object: torch's error then has the OSError
    (and its errno) as its context."""
    import errno

    import torch

    from atgrpo.trainer.write_faults import io_fault

    path = os.path.join(small_disk, "trainer_state.pt")
    with open(os.path.join(small_disk, "filler"), "wb") as f:
        f.write(b"\0" * (os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize - 4096))
    with pytest.raises(RuntimeError, match="inline_container") as e:
        torch.save({"a": torch.zeros(100_000)}, path)
    code, cause = io_fault(e.value, path)
    assert code == errno.ENOSPC and cause.startswith("No space left on device") and "torch's writer" in cause
    with pytest.raises(RuntimeError, match="inline_container") as e2, open(path, "wb") as f:
        torch.save({"a": torch.zeros(100_000)}, f)  # a file object: torch's error again, the OSError its context
    assert isinstance(e2.value.__context__, OSError) and io_fault(e2.value, None) == (errno.ENOSPC,
                                                                                     "No space left on device")


@pytest.fixture
def read_only():
    """``make(dir)``: ``dir`` read-only for real: a read-only bind mount over itself as root (chmod does not stop
    root), else no write permission; undone by ``undo()`` and at the end."""
    made = []

    def make(d: str) -> None:
        if os.geteuid() == 0:
            if subprocess.run(["mount", "--bind", d, d], capture_output=True).returncode != 0 or subprocess.run(
                    ["mount", "-o", "remount,bind,ro", d], capture_output=True).returncode != 0:
                pytest.skip("a read-only bind mount needs mount(8) and the right to mount")
        else:
            os.chmod(d, 0o555)
        made.append(d)

    def undo() -> None:
        while made:
            d = made.pop()
            subprocess.run(["umount", d], check=False) if os.geteuid() == 0 else os.chmod(d, 0o755)
    yield make, undo
    undo()


def test_a_read_only_checkpoint_directory_stops_in_one_line_and_resumes(tmp_path, monkeypatch, capsys, read_only):
    """A real read-only directory (the injected ones: tests/test_write_faults.py): ``checkpoint/`` turns read-only
    before step 2; the run stops at step 2's checkpoint, exit 2, naming it; writable again, the resume equals an
    uninterrupted run."""
    make, undo = read_only
    out = str(tmp_path / "run")
    before_step(monkeypatch, 2, lambda state: make(os.path.join(out, "checkpoint")))
    rc = main(["train", *ITEMS, "--out", out, "--quiet"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    cause = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"atgrpo: error: could not write the checkpoint {out}/checkpoint/step_2 ("), lines
    assert cause in lines[0] and "writable" in lines[0] and f"atgrpo train --resume {out}" in lines[0], lines
    assert [c.step for c in ck.list_checkpoints(out)] == [0, 1]
    undo()
    assert main(["train", "--resume", out, "--quiet"]) == 0
    ref = str(tmp_path / "ref")
    assert main(["train", *ITEMS, "--out", ref, "--quiet"]) == 0
    assert run_rows(out) == run_rows(ref)
