"""`atgrpo bench real-table`: the cell plan, selection, skipping of finished cells, the dry run, cells side by
side, and table.json assembled from cell files that a tiny real run wrote through the command's own code path (the
configs of the table with a tiny model swapped in by overrides, recorded in each cell file). A cell's run directory
across attempts and config changes: tests/test_real_cells_resume.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from atgrpo.bench import real_table as rt
from atgrpo.bench.real_cells import cell_file, finished_cells
from atgrpo.bench.real_command import run_real_table
from atgrpo.bench.real_estimate import estimate, evaluations, model_seconds
from hf_dirs import needs_smollm2
from atgrpo.cli import main
from atgrpo.config import load_config

ROOT = Path(__file__).parent.parent
# the table's configs with the tiny model, compact prompts and a two-problem budget: seconds instead of minutes
TINY = ["model.kind=tiny", "model.preset=null", "env.style=compact", "model.max_prompt_tokens=256",
        "warmstart.episodes=4", "train.steps=1", "eval.problems=2", "eval.every=0", "rollout.K=2",
        "rollout.problems_per_step=2", "rollout.max_new_tokens=8", "model.tiny.hidden_size=16",
        "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=32"]


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    """Two math cells (single agent + GRPO and the L1 team, seed 0) run by the command; its lines and dirs."""
    base = tmp_path_factory.mktemp("real_table")
    out, runs, lines = str(base / "out"), str(base / "runs"), []
    result = run_real_table(out, runs, ["math"], ["single", "mas"], [0], extra=TINY, root=str(ROOT),
                            say=lines.append)
    return {"out": out, "runs": runs, "lines": lines, "result": result}


def test_config_files_are_what_write_configs_writes(tmp_path):
    """configs/real/table/ holds one file per task and RL row, byte for byte what the definitions write, and
    each loads to the same config as the definitions' overrides."""
    written = rt.write_configs(str(tmp_path))
    hint = "regenerate: python -m atgrpo.bench.real_table --write-configs configs/real/table"
    assert len(written) == len(rt.TASKS) * len(rt.RL_ROWS)
    assert sorted(os.listdir(ROOT / rt.CONFIG_DIR)) == sorted(os.path.basename(p) for p in written), hint
    for path in written:
        committed = ROOT / rt.CONFIG_DIR / os.path.basename(path)
        assert committed.read_text() == Path(path).read_text(), f"{committed} differs; {hint}"
    cfg = load_config(str(ROOT / rt.config_path("code", "mas_L3")))
    assert cfg == load_config(None, rt.row_overrides("code", "mas_L3"))
    assert (cfg.policy.sharing, cfg.model.preset, cfg.env.style, cfg.eval.problems) == ("L3", "smollm2-135m",
                                                                                       "chat", 50)


def test_rows_of_a_task_share_the_warm_start_budget_and_held_out_problems():
    """The single agent plays SINGLE_SCALE times the team's warm-start episodes and problems per step (a team
    episode feeds two roles); everything else but the sharing level is the same within a task."""
    for task in rt.TASKS:
        team, single = (load_config(None, rt.row_overrides(task, r)) for r in ("mas_L1", "single_grpo"))
        ep, pr = rt.SINGLE_SCALE[task]
        assert single.warmstart.episodes == round(team.warmstart.episodes * ep)
        assert single.rollout.problems_per_step == round(team.rollout.problems_per_step * pr)
        assert single.policy.sharing == "L0" and team.policy.sharing == "L1"
        assert single.eval == team.eval and single.eval.problems >= 50
        assert single.train == team.train and single.rollout.K == team.rollout.K


def test_selection_maps_no_rl_rows_to_their_rl_cells_and_orders_cells():
    cells = rt.select(["code", "math"], ["mas", "mas_L1", "single"], [1, 0])
    assert [c.name for c in cells] == ["math/single_grpo/seed0", "math/single_grpo/seed1", "math/mas_L1/seed0",
                                       "math/mas_L1/seed1", "code/single_grpo/seed0", "code/single_grpo/seed1",
                                       "code/mas_L1/seed0", "code/mas_L1/seed1"]
    assert len(rt.select(None, None, None)) == len(rt.TASKS) * len(rt.RL_ROWS) * 2  # seeds 0 and 1 by default


@pytest.mark.parametrize("args, word", [(["--tasks", "chess"], "chess"), (["--rows", "mas_L9"], "mas_L9"),
                                        (["--seeds", "x"], "'x'")])
def test_unknown_task_row_or_seed_is_one_line_error_before_any_work(args, word, tmp_path, capsys):
    code = main(["bench", "real-table", "--dry-run", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and word in err and len(err.strip().splitlines()) == 1
    assert not os.listdir(tmp_path)
    with pytest.raises(rt.TableError, match="choose from: math, plan_path, sokoban, sudoku, code"):
        rt.select(["chess"], None, None)


def test_cost_model_reproduces_its_calibration_run():
    """configs/real/math_mas_L1.yaml took 983 s on a quiet 2-core EPYC (docs/results.md); the cost model, fitted
    on it and Plan-Path, gives it within 25 %."""
    cfg = load_config(str(ROOT / "configs" / "real" / "math_mas_L1.yaml"))
    assert abs(model_seconds("math", cfg) - 983) / 983 < 0.25
    assert evaluations(12, 6) == 3 and evaluations(5, 0) == 2 and evaluations(10, 3) == 5


def test_cells_are_saved_with_their_measurements(tiny_table):
    assert tiny_table["result"]["failed"] == []
    cell = json.loads(Path(cell_file(tiny_table["out"], rt.Cell("math", "mas_L1", 0))).read_text())
    assert cell["extra_overrides"] == TINY and cell["config"] == "configs/real/table/math_mas_L1.yaml"
    assert cell["evals"][0][0] == 0 and cell["evals"][-1] == [1, cell["end"]] and cell["start"] == cell["evals"][0][1]
    assert cell["precision"] == "float32" and cell["cpu"] and cell["wall_seconds"] > 0 and cell["samples"] > 0
    assert cell["peak_rss_gb"] > 0.1  # the tiny model's run: torch and transformers alone take more
    assert [step for step, _ in cell["rollout_success"]] == [1] and 0 <= cell["rollout_success"][0][1] <= 1
    assert not os.path.exists(os.path.join(tiny_table["runs"], "math", "mas_L1", "seed0", "checkpoint"))
    progress = [ln for ln in tiny_table["lines"] if ln.startswith("[2/2]") and "left" in ln]
    assert progress and "elapsed" in progress[0]


def test_table_json_is_assembled_from_the_cell_files(tiny_table, tmp_path):
    table = json.loads(Path(tiny_table["out"], "table.json").read_text())
    cells = {(c["row"], c["seed"]): c for c in finished_cells(tiny_table["out"])}
    math = table["table"]["math"]
    assert math["mas"]["seeds"]["0"]["success"] == cells[("mas_L1", 0)]["start"]
    assert math["mas_L1"]["seeds"]["0"]["success"] == cells[("mas_L1", 0)]["end"]
    assert math["single"]["seeds"]["0"]["success"] == cells[("single_grpo", 0)]["start"]
    assert math["mas_L3"]["n"] == 0 and "math/mas_L3/seed0" in table["missing"]
    assert "math/mas_L1/seed0" not in table["missing"]
    assert "| MAS (no RL) |" in Path(tiny_table["out"], "table.md").read_text()
    assert math["mas_L1"]["seeds"]["0"]["rollout_success"] == cells[("mas_L1", 0)]["rollout_success"]
    assert Path(tiny_table["out"], "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --report-only: the same table from the cell files, nothing run
    again = run_real_table(tiny_table["out"], str(tmp_path / "none"), report_only=True, say=lambda _: None)
    assert again["table"] == table and not (tmp_path / "none").exists()


def test_rerun_skips_finished_cells_and_dry_run_uses_their_times(tiny_table, tmp_path):
    before = os.path.getmtime(cell_file(tiny_table["out"], rt.Cell("math", "mas_L1", 0)))
    lines: list[str] = []
    result = run_real_table(tiny_table["out"], tiny_table["runs"], ["math"], ["mas_L1"], [0], extra=TINY,
                            root=str(ROOT), say=lines.append)
    assert result["failed"] == [] and lines[-2].startswith("1 cells, 1 done, 0 to run")
    assert os.path.getmtime(cell_file(tiny_table["out"], rt.Cell("math", "mas_L1", 0))) == before
    lines.clear()
    dry = run_real_table(tiny_table["out"], str(tmp_path / "runs"), ["math"], ["mas_L1", "mas_L3"], [0, 1],
                         dry_run=True, say=lines.append)
    wall = json.loads(Path(cell_file(tiny_table["out"], rt.Cell("math", "mas_L1", 0))).read_text())["wall_seconds"]
    states = {r["cell"].name: (r["done"], r["source"], r["seconds"]) for r in dry["plan"]}
    assert states["math/mas_L1/seed0"][:2] == (True, "measured")
    assert states["math/mas_L1/seed1"] == (False, "measured", wall)  # the finished seed's time
    assert states["math/mas_L3/seed0"] == (False, "measured as mas_L1", wall)  # the other team row's time
    assert len(lines) == 5 and "math/mas_L1/seed1" in lines[1] and "todo" in lines[1] and "(measured)" in lines[1]
    assert lines[-1].startswith("4 cells, 1 done, 3 to run")
    assert not (tmp_path / "runs").exists() and dry["table"] is None


def test_estimate_borrows_only_the_other_team_rows_time():
    cfg = load_config(str(ROOT / "configs/real/table/sokoban_mas_L1.yaml"))
    finished = [{"task": "sokoban", "row": "mas_L1", "wall_seconds": 2400.0},
                {"task": "sokoban", "row": "mas_L1", "wall_seconds": 2600.0},
                {"task": "math", "row": "mas_L3", "wall_seconds": 60.0}]
    assert estimate("sokoban", "mas_L1", cfg, finished) == (2500.0, "measured")
    assert estimate("sokoban", "mas_L3", cfg, finished) == (2500.0, "measured as mas_L1")
    assert estimate("sokoban", "single_grpo", cfg, finished)[1] == "model"  # one role: not a team cell's time
    assert estimate("plan_path", "mas_L3", cfg, finished)[1] == "model"  # another task's times never count


def test_estimate_prefers_a_stale_cells_time_to_the_cost_model():
    cfg = load_config(str(ROOT / "configs/real/table/plan_path_mas_L1.yaml"))
    earlier = [{"task": "plan_path", "row": "mas_L1", "wall_seconds": 2400.0}]
    current = [{"task": "plan_path", "row": "mas_L1", "wall_seconds": 2000.0}]
    assert estimate("plan_path", "mas_L1", cfg, [], earlier) == (2400.0, "measured, earlier config")
    assert estimate("plan_path", "mas_L1", cfg, current, earlier) == (2000.0, "measured")  # today's config first
    assert estimate("plan_path", "mas_L3", cfg, [], earlier) == (2400.0, "measured as mas_L1, earlier config")
    assert estimate("plan_path", "single_grpo", cfg, [], earlier)[1] == "model"  # not a team cell's time


def test_plan_lines_mark_cells_estimated_over_the_budget():
    from atgrpo.bench.real_cells import plan_lines

    rows = [{"cell": rt.Cell("sokoban", "mas_L1", 0), "done": False, "seconds": 31 * 60, "source": "model"},
            {"cell": rt.Cell("math", "mas_L1", 0), "done": True, "seconds": 20 * 60, "source": "measured"}]
    lines = plan_lines(rows)
    assert "OVER the 30 min budget" in lines[0] and "OVER" not in lines[1] and "done" in lines[1]
    assert lines[-1] == "2 cells, 1 done, 1 to run: ~0.5 h estimated"  # only the cells to run count


def test_a_failed_cell_stays_todo_and_its_time_counts_when_it_is_rerun(tmp_path):
    """A cell that raises part-way is reported, writes no cell file, and keeps its time spent; the next
    invocation runs it again (its run directory resumed) and the cell's wall time includes the first attempt."""
    out, runs, cell = str(tmp_path / "out"), str(tmp_path / "runs"), rt.Cell("math", "mas_L1", 1)
    bad = run_real_table(out, runs, ["math"], ["mas_L1"], [1], extra=TINY + ["model.max_prompt_tokens=8"],
                         root=str(ROOT), say=lambda _: None)
    assert [f["cell"] for f in bad["failed"]] == ["math/mas_L1/seed1"]
    assert "max_prompt_tokens" in bad["failed"][0]["error"]
    assert not os.path.exists(cell_file(out, cell)) and "math/mas_L1/seed1" in bad["table"]["missing"]
    first = json.loads(Path(runs, "math", "mas_L1", "seed1", "cell_wall.json").read_text())["seconds"]
    good = run_real_table(out, runs, ["math"], ["mas_L1"], [1], extra=TINY, root=str(ROOT), say=lambda _: None)
    assert good["failed"] == [] and good["table"]["table"]["math"]["mas_L1"]["n"] == 1
    assert json.loads(Path(cell_file(out, cell)).read_text())["wall_seconds"] > first > 0


def test_threads_flag_becomes_each_cells_train_threads(monkeypatch, tmp_path):
    """``--threads N``: every cell runs with train.threads=N (an override recorded in its cell file)."""
    import atgrpo.bench.real_command as rc

    seen: dict = {}
    monkeypatch.setattr(rc, "run_real_table", lambda *a, **k: seen.update(k) or {"failed": []})
    assert main(["bench", "real-table", "--dry-run", "--threads", "2", "--out", str(tmp_path)]) == 0
    assert seen["extra"] == ["train.threads=2"]
    assert main(["bench", "real-table", "--dry-run", "--out", str(tmp_path)]) == 0
    assert seen["extra"] is None


def test_the_table_is_rewritten_after_each_cell(tmp_path, monkeypatch):
    """A run stopped between cells (here: the second cell fails) leaves table.json holding the first."""
    import atgrpo.bench.real_cells as rc

    template = json.loads((ROOT / "docs/results/real/cells/math/mas_L1/seed0.json").read_text())
    out = str(tmp_path)
    seen = []

    def fake_run_cell(cell, out_, *a, **k):
        if seen:  # the second cell: the first one is in the table already
            seen.append(json.loads(Path(out_, "table.json").read_text()))
            raise RuntimeError("stopped")
        result = {**template, "task": cell.task, "row": cell.row, "seed": cell.seed}
        os.makedirs(os.path.dirname(cell_file(out_, cell)), exist_ok=True)
        Path(cell_file(out_, cell)).write_text(json.dumps(result))
        seen.append(cell)
        return result

    monkeypatch.setattr(rc, "run_cell", fake_run_cell)
    cells = [rt.Cell("math", "mas_L1", 7), rt.Cell("math", "mas_L1", 8)]
    rows = [{"cell": c, "done": False, "seconds": 60.0, "source": "model"} for c in cells]
    failed = rc.run_plan(rows, out, str(tmp_path / "runs"), [], str(ROOT), say=lambda line: None)
    assert [f["cell"] for f in failed] == ["math/mas_L1/seed8"]
    assert list(seen[1]["table"]["math"]["mas_L1"]["seeds"]) == ["7"]


@needs_smollm2
@pytest.mark.parametrize("game", ["plan_path", "sokoban", "sudoku"])
def test_table_token_caps_hold_the_expert_programs(game):
    """Each game's table config lets the tool agent write at least the expert's program (the warm start's
    demonstrations, in SmolLM2's tokens) with room for the code fence: a cap below it would cut every
    demonstrated program before its print."""
    from atgrpo.bench.experts import expert_program_tokens
    cfg = load_config(str(ROOT / f"configs/real/table/{game}_mas_L1.yaml"), [])
    lengths = expert_program_tokens(cfg, 20)
    assert max(lengths) + 10 <= cfg.rollout.max_new_tokens, (max(lengths), cfg.rollout.max_new_tokens)


def _row(*vals):
    from atgrpo.bench.real_report import summarize

    return summarize(list(vals))


def test_conditions_by_hand():
    """Plan-Path's three seeds (MAS 0.32, 0.84, 0.84: mean 2/3, pstd 0.2451) against L1 0.84, 0.90, 0.78
    (mean 0.84, pstd 0.049) and L3 0.92, 0.82 (0.87, 0.05): L3 is the better RL row, 0.87 - 0.6667 = 0.2033 <
    0.2451 (the larger std, MAS's) so not above MAS; above single + GRPO (0, 0) by 0.87 > 0.05; start 0.667 > 0.6."""
    from atgrpo.bench.real_report import conditions

    rows = {"single_grpo": _row(0.0, 0.0), "mas": _row(0.32, 0.84, 0.84), "mas_L1": _row(0.84, 0.90, 0.78),
            "mas_L3": _row(0.92, 0.82)}
    c = conditions(rows)
    assert c["best_rl_row"] == "mas_L3"
    assert c["above_single_grpo"] == {"met": True, "gap": 0.87, "std": 0.05}
    assert c["above_mas"] == {"met": False, "gap": 0.2033, "std": 0.2451}
    assert c["mas_start"] == {"met": False, "mean": 0.6667}
    # two seeds of MAS at 0.32 and 0.84: start 0.58 meets the cap; a row with one seed decides nothing
    rows["mas"] = _row(0.32, 0.84)
    assert conditions(rows)["mas_start"]["met"] is True and conditions(rows)["above_mas"]["met"] is True
    rows["mas_L1"], rows["mas_L3"] = _row(0.9), _row()
    assert conditions(rows)["above_mas"] is None and conditions(rows)["best_rl_row"] == "mas_L1"


def test_jobs_run_cells_side_by_side_with_the_results_of_one_at_a_time(tiny_table, tmp_path):
    """``jobs=2``: the fixture's two cells, each in a process of its own at the same time, finish with the held-out
    evaluations they had when run one after the other in this process."""
    lines: list[str] = []
    out = str(tmp_path / "out")
    result = run_real_table(out, str(tmp_path / "runs"), ["math"], ["single", "mas"], [0], extra=TINY,
                            root=str(ROOT), say=lines.append, jobs=2)
    assert result["failed"] == [] and "2 cells, 2 at a time" in lines
    assert sum(ln.startswith(("[1/2]", "[2/2]")) for ln in lines) == 2
    alone = {(c["row"], c["seed"]): c["evals"] for c in finished_cells(tiny_table["out"])}
    together = {(c["row"], c["seed"]): c["evals"] for c in finished_cells(out)}
    assert together == alone and len(together) == 2
