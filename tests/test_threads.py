"""The default thread count (train.threads=0): the cores that are free, printed at start-up and recorded in
config.yaml so that a resumed run uses the same count."""

import os

import pytest
import yaml

from atgrpo import threads
from atgrpo.cli import main


@pytest.mark.parametrize("cores, load, expected", [
    (8, 0.0, 8), (8, 3.2, 5), (8, 3.6, 4), (8, 7.9, 1), (8, 20.0, 1), (2, 3.8, 1), (4, None, 4), (1, 0.0, 1),
])
def test_free_threads(cores, load, expected):
    assert threads.free_threads(cores, load) == expected


def test_choice_order(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads(2) == (2, "train.threads")
    assert threads.choose_threads(0) == (3, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "usable_cores", lambda: 6)
    monkeypatch.setattr(threads, "_load_average", lambda: 2.4)
    assert threads.choose_threads(0) == (4, "free cores: 6 usable, load average 2.4")


def test_usable_cores_is_within_the_affinity_set():
    n = threads.usable_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))


def test_the_choice_is_printed_and_recorded(tmp_path, fast_overrides, capsys, monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "_load_average", lambda: 1e9)  # a saturated machine: one thread
    before = torch.get_num_threads()
    try:
        out = tmp_path / "run"
        assert main(["train", *fast_overrides, "warmstart.enabled=false", "train.steps=1", "eval.problems=2",
                     "--out", str(out)]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    printed = capsys.readouterr().out
    assert "atgrpo: threads=1 (free cores: " in printed and "set train.threads=N to choose" in printed
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["threads"] == 1
