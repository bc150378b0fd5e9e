"""A table cell's run directory across attempts and config changes (``bench/real_cells.py``): the time of earlier
attempts, results made stale by a changed recipe, partial runs moved aside or resumed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from atgrpo.bench import real_table as rt
from atgrpo.bench.real_cells import cell_file

ROOT = Path(__file__).parent.parent


def test_earlier_attempts_count_records_kills_up_to_the_newest_checkpoint_and_finished_runs(tmp_path):
    from atgrpo.bench.real_cells import WALL_FILE, earlier_seconds

    run, t0 = tmp_path / "seed0", 1_000_000.0
    (run / "checkpoint" / "step_2").mkdir(parents=True)
    for name, at in (("config.yaml", t0), ("checkpoint/step_2/progress.json", t0 + 1700),
                     ("checkpoint/step_2/trainer_state.pt", t0 + 1700), ("checkpoint/step_2/manifest.json", t0 + 1740)):
        (run / name).write_text("{}")
        os.utime(run / name, (at, at))
    assert earlier_seconds(str(tmp_path / "fresh")) == 0.0
    assert earlier_seconds(str(run)) == 1740.0  # SIGKILLed after step 2: start to the checkpoint it kept
    (run / WALL_FILE).write_text(json.dumps({"seconds": 600.0}))
    os.utime(run / WALL_FILE, (t0 + 1800, t0 + 1800))  # that attempt saw its end and recorded itself
    assert earlier_seconds(str(run)) == 600.0
    os.utime(run / WALL_FILE, (t0 - 100, t0 - 100))  # an older attempt's record, then one killed: both count
    assert earlier_seconds(str(run)) == 600.0 + 1740.0
    (run / "summary.json").write_text(json.dumps({"wall_seconds": 2100.0}))
    os.utime(run / "summary.json", (t0 + 2100, t0 + 2100))  # then one that finished, evaluations and all
    assert earlier_seconds(str(run)) == 600.0 + 2100.0
    os.utime(run / "config.yaml", (t0 + 2200, t0 + 2200))  # a later start (train.steps extended): not finished
    assert earlier_seconds(str(run)) == 600.0


def test_a_cell_run_with_an_earlier_config_is_stale_left_out_of_the_table_and_rerun_afresh(tmp_path, monkeypatch):
    """Changing a task's settings retires its finished cells: they are marked stale, the table leaves them out,
    and running the cell again starts a new run directory (the old one is moved aside, not resumed)."""
    import shutil

    import yaml

    import atgrpo.trainer.run as trainer_run
    from atgrpo.bench.real_cells import cell_config, config_digest, current_cells, plan, plan_lines, run_cell
    from atgrpo.bench.real_report import write_report

    root = tmp_path / "root"
    shutil.copytree(ROOT / "configs/real/table", root / "configs/real/table")
    out, runs, cell = str(tmp_path / "out"), str(tmp_path / "runs"), rt.Cell("math", "mas_L1", 0)
    result = json.loads((ROOT / "docs/results/real/cells/math/mas_L1/seed0.json").read_text())
    result["config_sha"] = config_digest("math", "mas_L1", str(root))
    os.makedirs(os.path.dirname(cell_file(out, cell)))
    Path(cell_file(out, cell)).write_text(json.dumps(result))
    config = root / "configs/real/table/math_mas_L1.yaml"
    config.write_text(config.read_text() + "# a comment changes nothing\n")
    assert plan([cell], out, [], str(root))[0]["done"]
    # how the work is split into micro-batches does not change the recipe: the result stays current
    config.write_text(config.read_text().replace("update_token_budget: 2048", "update_token_budget: 1024"))
    assert plan([cell], out, [], str(root))[0]["done"]
    ran_with = yaml.safe_dump(cell_config(cell, [], str(root)).to_dict())
    config.write_text(config.read_text().replace("steps: 12", "steps: 11"))
    row = plan([cell], out, [], str(root))[0]
    assert (row["done"], row["stale"]) == (False, True) and " stale " in plan_lines([row])[0]
    assert current_cells(out, str(root)) == ([], ["math/mas_L1/seed0"])
    write_report(*current_cells(out, str(root)), str(tmp_path / "table"))
    table = json.loads((tmp_path / "table/table.json").read_text())
    assert table["stale"] == ["math/mas_L1/seed0"] and table["table"]["math"]["mas_L1"]["n"] == 0
    assert "Stale" in (tmp_path / "table/table.md").read_text()
    old_run = Path(runs, "math", "mas_L1", "seed0")
    os.makedirs(old_run / "checkpoint")
    (old_run / "config.yaml").write_text(ran_with)
    seen = []
    monkeypatch.setattr(trainer_run, "train", lambda cfg, d, **k: seen.append(os.path.isdir(d)) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_cell(cell, out, runs, [], str(root))
    assert seen == [False] and [p.name.split("-")[0] for p in old_run.parent.iterdir()] == ["seed0.stale"]


def test_a_partial_run_from_another_config_is_moved_aside_not_resumed(tmp_path):
    """A cell stopped part-way under an earlier recipe has no result file to mark it stale; resuming its checkpoint
    under the new config would mix the two recipes in one cell, so its directory is moved aside. A partial run
    under the same config resumes, also when only the keys the trainer resolves from the machine differ, and also
    when the cell has a stale result file from an earlier recipe (the partial run was started after the change)."""
    import yaml

    from atgrpo.bench.real_cells import cell_config, retire_stale_run
    from atgrpo.trainer.run_dir import config_changes

    cfg = cell_config(rt.Cell("sudoku", "mas_L3", 1), ["train.threads=2"], str(ROOT))
    run = tmp_path / "seed1"
    assert retire_stale_run(str(run), cfg) is None  # nothing there yet
    os.makedirs(run / "checkpoint" / "step_2")
    saved = cfg.to_dict()
    saved["train"]["threads"], saved["model"]["precision"] = 1, "bfloat16"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert config_changes(str(run), cfg) == []
    assert retire_stale_run(str(run), cfg) is None and run.is_dir()
    saved["warmstart"]["lr"], saved["algo"]["warmup_steps"] = 1.0e-3, 0
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert config_changes(str(run), cfg) == ["algo.warmup_steps", "warmstart.lr"]
    reason = retire_stale_run(str(run), cfg)
    assert "algo.warmup_steps, warmstart.lr" in reason and not run.exists()
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["seed1.stale"]


def test_a_stale_result_does_not_retire_a_partial_run_of_the_current_config(tmp_path, monkeypatch):
    """The cell's result file is from an earlier config (stale); its run directory holds a run stopped part-way
    under today's config. run_cell resumes that directory instead of moving it aside and starting over."""
    import yaml

    from atgrpo.bench import real_cells

    cell = rt.Cell("sudoku", "mas_L3", 1)
    out, runs = tmp_path / "out", tmp_path / "runs"
    stale = out / "cells" / "sudoku" / "mas_L3" / "seed1.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"task": "sudoku", "row": "mas_L3", "seed": 1, "config_sha": "earlier"}))
    assert not real_cells.is_current(json.loads(stale.read_text()), str(ROOT))
    cfg = real_cells.cell_config(cell, [], str(ROOT))
    run = runs / "sudoku" / "mas_L3" / "seed1"
    os.makedirs(run / "checkpoint" / "step_4")
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    calls = []

    def train(cfg, directory, progress, resume):
        calls.append((directory, resume))
        raise KeyboardInterrupt  # stop at once: only the decision to resume is under test

    monkeypatch.setattr("atgrpo.trainer.run.train", train)
    with pytest.raises(KeyboardInterrupt):
        real_cells.run_cell(cell, str(out), str(runs), [], str(ROOT))
    assert calls == [(str(run), True)] and (run / "checkpoint" / "step_4").is_dir()
    assert not list(run.parent.glob("seed1.stale-*"))
