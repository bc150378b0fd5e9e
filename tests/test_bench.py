"""Smoke tests of the benchmarks (atgrpo/bench): each runs at a tiny size and writes JSON + markdown with the
fields the docs rely on. Speed targets are benchmarks (docs/performance.md), never asserted here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from atgrpo.bench.common import Shape
from atgrpo.cli import main
from atgrpo.policies import TinyModelConfig

SMALL = Shape(prompts=2, prompt_len=(10, 14), K=2, new_tokens=3, reps=1, warmup=0,
              tiny=TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))
COMMON = {"bench", "shape", "machine", "methods", "ratios", "targets", "command"}


def _check(result: dict, path, methods: set[str]) -> None:
    saved = json.loads(path.read_text())
    assert COMMON <= set(saved) and set(saved["methods"]) == methods
    for m in methods:
        assert saved["methods"][m]["tokens"] == SMALL.response_tokens
        assert saved["methods"][m]["median_s"] > 0 and saved["methods"][m]["tokens_per_s"] > 0
    assert saved["machine"]["nproc"] >= 1 and saved["machine"]["cpu_model"]
    assert path.with_suffix(".md").read_text().startswith("## ")
    assert result["ratios"] == saved["ratios"]


def test_bench_rollout_cli(tmp_path, capsys):
    rc = main(["bench", "rollout", "--prompts", "2", "--prompt-len", "10-14", "-K", "2", "--new-tokens", "3",
               "--reps", "1", "--warmup", "0", "--hidden-size", "16", "--num-layers", "1", "--tag", "t",
               "--out", str(tmp_path)])
    assert rc == 0 and "tree" in capsys.readouterr().out
    saved = json.loads((tmp_path / "rollout_t.json").read_text())
    assert set(saved["methods"]) == {"tree", "naive_loop", "hf_generate"}
    assert set(saved["ratios"]) == {"tree_vs_naive_loop", "tree_vs_hf_generate"}
    assert saved["command"].startswith("atgrpo bench rollout")
    assert all(m["tokens"] == 2 * 2 * 3 for m in saved["methods"].values())


def test_bench_update(tmp_path):
    from atgrpo.bench.update import bench_update

    r = bench_update(SMALL, str(tmp_path), "update", peak_n=128)
    _check(r, tmp_path / "update.json", {"per_sample", "shared_prefix"})
    assert r["grads_equal"] and r["grad_max_abs_diff"] < 1e-5
    assert 0 < r["methods"]["shared_prefix"]["model_flops"] < r["methods"]["per_sample"]["model_flops"]
    assert r["methods"]["shared_prefix"]["mfu"] > 0 and r["matmul_peak_flops"] > 0


def test_bench_bfloat16_methods_beside_float32(tmp_path):
    """--precision both: the bfloat16 copy's rollout and the autocast update beside the float32 ones, each with
    MFU against its own precision's peak, and the CPU's bfloat16 units named in the report."""
    from atgrpo.bench.rollout import bench_rollout
    from atgrpo.bench.update import bench_update

    both = ("float32", "bfloat16")
    r = bench_rollout(SMALL, str(tmp_path), "rollout", peak_n=128, precisions=both)
    _check(r, tmp_path / "rollout.json", {"tree", "naive_loop", "hf_generate", "tree_bf16_copy"})
    assert r["methods"]["tree_bf16_copy"]["precision"] == "bfloat16" and r["methods"]["tree"]["precision"] == "float32"
    assert set(r["matmul_peaks"]) == {"float32", "bfloat16"} and min(r["matmul_peaks"].values()) > 0
    peak = r["matmul_peaks"]["bfloat16"]
    m = r["methods"]["tree_bf16_copy"]
    if r["machine"]["bf16_units"]:
        assert m["mfu"] == pytest.approx(m["model_flops"] / m["median_s"] / peak)
    else:  # an emulated bfloat16 "peak" bounds nothing: no MFU against it
        assert m["mfu"] is None and "| - |" in (tmp_path / "rollout.md").read_text()
    assert "tree_bf16_copy_vs_tree" in r["ratios"] and r["logprob_gap"]["rollout/logprob_gap/bench/mean"] < 0.05
    assert "bfloat16 units" in (tmp_path / "rollout.md").read_text()
    assert isinstance(r["machine"]["bf16_units"], list)
    u = bench_update(SMALL, str(tmp_path), "update", peak_n=128, precisions=both)
    assert u["methods"]["shared_prefix_bf16"]["precision"] == "bfloat16"
    assert 0 < u["grad_rel_diff_bf16"] < 0.05  # bfloat16 rounding of the same gradient


def test_matmul_peak_stops_growing_once_a_product_is_slow():
    """The peak's size search: a product that takes min_seconds stops it (0 s: the first, 256), else it grows to
    n; a CPU that emulates bfloat16 would spend minutes on a 4096^3 product."""
    import torch

    from atgrpo.bench.common import matmul_peak_flops, peak_size

    assert peak_size(4096, torch.bfloat16, min_seconds=0.0) == 256
    assert peak_size(512, torch.float32, min_seconds=float("inf")) == 512
    assert peak_size(128, torch.float32) == 128
    assert matmul_peak_flops(4096, reps=1, dtype=torch.bfloat16, min_seconds=0.0) > 0


def test_bench_step(tmp_path):
    from atgrpo.bench.step import bench_step

    has_trl = importlib.util.find_spec("trl") is not None
    r = bench_step(SMALL, str(tmp_path), "step", with_trl=has_trl)
    _check(r, tmp_path / "step.json", {"atgrpo", "trl"} if has_trl else {"atgrpo"})
    assert r["trl"]["available"] is has_trl
    if has_trl:
        assert r["ratios"]["atgrpo_vs_trl"] > 0 and r["trl"]["completion_mean_lengths"]


def test_bench_step_in_bfloat16_samples_from_the_copy_and_refreshes_it(tmp_path, monkeypatch):
    """precision=bfloat16: atgrpo's step samples from a rollout copy, takes the trainer's log-probs in the update
    and refreshes the copy; both trainers are told to compute in bfloat16."""
    import atgrpo.bench.step as step
    from atgrpo.policies.rollout_copy import RolloutCopies

    made: list[RolloutCopies] = []
    monkeypatch.setattr(step, "RolloutCopies", lambda policies: made.append(RolloutCopies(policies)) or made[-1])
    has_trl = importlib.util.find_spec("trl") is not None
    r = step.bench_step(SMALL, str(tmp_path), "step_bf16", with_trl=has_trl, precision="bfloat16")
    _check(r, tmp_path / "step_bf16.json", {"atgrpo", "trl"} if has_trl else {"atgrpo"})
    assert r["precision"] == "bfloat16" and "precision bfloat16 on both sides" in (tmp_path / "step_bf16.md").read_text()
    (copies,) = made
    view = copies.views["bench"]
    trainer = dict(view.policy.model.named_parameters())
    for name, p in view.sampler.model.named_parameters():  # refreshed after the last update
        assert torch.equal(p, trainer[name].detach().to(p.dtype)), name


def test_bench_real_model_shape_uses_chat_prompts_and_the_models_tokenizer(tmp_path):
    """The real-model path of rollout / update / step (``--preset smollm2``), on a tiny Hugging Face directory:
    chat prompts through the template, the model's EOS suppressed, TRL given the model's own tokenizer."""
    import dataclasses

    from atgrpo.bench.rollout import bench_rollout
    from atgrpo.bench.step import bench_step
    from atgrpo.bench.update import bench_update
    from hf_dirs import write_tiny_hf_dir

    shape = dataclasses.replace(SMALL, prompt_len=(60, 60), model=write_tiny_hf_dir(str(tmp_path / "m")),
                                micro_batch_size=2, token_budget=80)  # several passes per update, as for SmolLM2
    r = bench_rollout(shape, str(tmp_path), "rollout", peak_n=128)
    assert set(r["methods"]) == {"tree", "hf_generate"} and r["targets"] == {"tree_vs_hf_generate": 2.5}
    assert all(m["tokens"] == SMALL.response_tokens and m["mfu"] > 0 for m in r["methods"].values())
    u = bench_update(shape, str(tmp_path), "update", peak_n=128)
    assert u["grads_equal"]
    has_trl = importlib.util.find_spec("trl") is not None
    s = bench_step(shape, str(tmp_path), "step", with_trl=has_trl)
    assert s["targets"] == {"atgrpo_vs_trl": 3.0} and s["methods"]["atgrpo"]["tokens"] == SMALL.response_tokens
    if has_trl:
        assert s["trl"]["completion_mean_lengths"] and s["ratios"]["atgrpo_vs_trl"] > 0


def test_byte_tokenizer_fast_matches_byte_tokenizer():
    from atgrpo.bench.step import byte_tokenizer_fast
    from atgrpo.policies import ByteTokenizer

    tok = byte_tokenizer_fast()
    for text in ("hello", "héllo wörld ✓", " a  b\n\tc", "#.A\nG>"):
        assert tok(text)["input_ids"] == ByteTokenizer().encode(text, add_bos=True)


@pytest.mark.slow
def test_learning_bench_quick_writes_the_table(tmp_path):
    from atgrpo.bench.learning import ROW_ORDER, run_learning_bench

    result = run_learning_bench(str(tmp_path), "quick", tasks=["plan_path"], progress=False)
    assert set(result["table"]) == set(ROW_ORDER)
    assert all("plan_path" in cells for cells in result["table"].values())
    for name in ("results.json", "results.md", "learning_curves.png"):
        assert (tmp_path / name).exists()


def test_game_config_files_match_the_learning_bench():
    """configs/games/ holds one file per (task, row) of the table; each loads to the bench's own config."""
    from pathlib import Path

    from atgrpo.bench.learning import CONFIG_NAMES, ROW_ORDER, TASKS, row_overrides
    from atgrpo.config import load_config

    root = Path(__file__).parent.parent / "configs" / "games"
    assert len(list(root.glob("*.yaml"))) == len(TASKS) * len(ROW_ORDER)
    for task in TASKS:
        for row in ROW_ORDER:
            path = root / f"{task}_{CONFIG_NAMES[row]}.yaml"
            hint = "regenerate: python -m atgrpo.bench.learning --write-configs configs/games"
            assert path.exists(), f"{path} missing; {hint}"
            assert load_config(str(path)) == load_config(None, row_overrides(task, row)), f"{path} differs; {hint}"
            assert (load_config(str(path)).train.steps == 0) == (row in ("single agent", "MAS (no RL)"))



def test_learning_bench_rejects_unknown_tasks_before_running(tmp_path, capsys):
    from atgrpo.cli import main

    assert main(["bench", "learning", "--quick", "--tasks", "plan_path,chess", "--out", str(tmp_path)]) == 2
    assert "chess" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    assert main(["bench", "learning", "--quick", "--methods", "mas_atgrpo_L3,L9", "--out", str(tmp_path)]) == 2
    assert "L9" in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_learning_bench_reports_a_failed_cell_and_keeps_the_others(tmp_path, monkeypatch):
    """A cell that raises (here: a 1x1 Plan-Path grid, refused by the env) is listed as failed and left out of
    the table; the other cells finish and are tabled."""
    from atgrpo.bench import learning

    monkeypatch.setitem(learning.TASKS, "broken", ["env.name=plan_path", "env.kwargs.size=1"])
    result = learning.run_learning_bench(str(tmp_path), "quick", tasks=["plan_path", "broken"], progress=False)
    assert len(result["failed"]) == len(learning.RL_METHODS)
    assert all(f["task"] == "broken" and f["error"] for f in result["failed"])
    assert len(result["runs"]) == len(learning.RL_METHODS)
    assert all("plan_path" in cells and "broken" not in cells for cells in result["table"].values())
    assert "FAILED" in (tmp_path / "results.md").read_text()
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == len(learning.RL_METHODS)


def test_teams_bench_cells_are_valid_configs():
    """Every cell of ``atgrpo bench teams`` loads; the team of two gets 3/2 the problems of the team of three."""
    from atgrpo.bench.teams import SHARING, TEAMS, cell_overrides
    from atgrpo.config import load_config

    for size in ("default", "quick"):
        cfgs = {(t, s): load_config(None, cell_overrides(t, s, size, 0)) for t in TEAMS for s in SHARING}
        assert {c.env.name for c in cfgs.values()} == {"math", "math_verify"}
        two, three = (cfgs[(t, "shared policy (L1)")].rollout.problems_per_step for t in TEAMS)
        assert 2 * two == 3 * three


@pytest.mark.slow
def test_teams_bench_quick_writes_the_table(tmp_path):
    from atgrpo.bench.teams import SHARING, TEAMS, run_teams_bench

    result = run_teams_bench(str(tmp_path), "quick", progress=False)
    assert not result["failed"] and len(result["runs"]) == len(TEAMS) * len(SHARING)
    assert all(set(cells) == set(SHARING) for cells in result["table"].values())
    assert "three roles" in (tmp_path / "results.md").read_text()


def test_constant_answer_baseline_scores_fixed_answers():
    """benchmarks/constant_answer.py: the solver's answer to held-out problem 0, given at every turn, solves
    problem 0; an answer with no move solves nothing."""
    from atgrpo.envs.sokoban import SokobanEnv

    env = SokobanEnv(size=5, max_turns=3, split="eval")
    env.reset(0)
    solution = env.expert_action("plan")
    r = subprocess.run([sys.executable, "benchmarks/constant_answer.py", "sokoban", "size=5", "max_turns=3",
                        "--problems", "1", "--answers", solution, "XX"], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == [f"{solution}: 1.00", "XX: 0.00"]


def test_transcript_counts_plan_copies_by_hand(tmp_path):
    """The move games' first-turn plan answers that copy the tool's proposal, by its length: a copy in another
    format counts, a shorter list or a copy in a later turn does not."""
    def plan(turn, proposed, response):
        prompt = f"...\nTool agent proposed [{', '.join(proposed)}]; simulated from the current position ..."
        return {"turn": turn, "agent": "plan", "prompt": prompt, "response": response, "local": 0.0}

    episodes = [{"success": True, "transcript": [plan(0, "RRD", "Copying it.\n[R, R, D]\n")]},
                {"success": False, "transcript": [plan(0, "RRD", "RRDL"), plan(1, "D", "D")]},
                {"success": True, "transcript": [plan(0, "UULLD", "UULLD")]}]
    (tmp_path / "eval_transcripts_start.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    r = subprocess.run([sys.executable, "benchmarks/transcript_counts.py", str(tmp_path)], capture_output=True,
                       text=True, check=True)
    assert json.loads(r.stdout)["eval_before"]["plan_copies_by_proposal_length"] == {"3": "1 of 2", "5": "1 of 1"}


def test_transcript_counts_by_hand(tmp_path):
    """benchmarks/transcript_counts.py on a hand-written run directory: solved episodes, turns by local reward,
    second turns equal to the first, samples by reward, groups holding one distinct response, programs' errors."""
    def turn(agent, local, response):
        return {"agent": agent, "local": local, "response": response}

    episodes = [{"success": True, "transcript": [turn("coder", 1.0, "a"), turn("tester", 1.5, "t"),
                                                 turn("coder", 1.0, "a")]},
                {"success": False, "transcript": [turn("coder", -0.5, "b"), turn("tester", 0.0, "t"),
                                                  turn("coder", 0.0, "c")]}]
    (tmp_path / "eval_transcripts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    samples = [{"agent": "coder", "group": "p/0/coder", "reward": r, "response": x}
               for r, x in [(1.0, "a"), (1.0, "a"), (-1.0, "b"), (-1.0, "b")]]
    for s in samples[2:]:
        s["info"] = {"stderr": "Traceback (most recent call last):\n  ...\nNameError: name 'b' is not defined\n"}
    samples += [{"agent": "coder", "group": "p/1/coder", "reward": 0.0, "response": "a"}] * 2
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_3.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    r = subprocess.run([sys.executable, "benchmarks/transcript_counts.py", str(tmp_path)], capture_output=True,
                       text=True, check=True)
    out = json.loads(r.stdout)
    assert set(out) == {"eval_after", "step_3"}
    after = out["eval_after"]
    assert (after["episodes"], after["solved"]) == (2, 1)
    assert after["turns_by_local_reward"] == {"coder": {"-0.5": 1, "0.0": 1, "1.0": 2}, "tester": {"0.0": 1, "1.5": 1}}
    assert after["second_turn_verbatim"] == {"coder": "1 of 2"}
    assert after["plan_copies_by_proposal_length"] == {}  # no move game
    assert out["step_3"] == {"coder": {"samples_by_reward": {"-1.0": 2, "0.0": 2, "1.0": 2}, "groups": 2,
                                       "groups_one_response": 1,
                                       "errors": {"NameError: name 'b' is not defined": 2}}}
