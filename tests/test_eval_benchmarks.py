"""atgrpo eval --benchmarks: pass@k from n samples (the unbiased estimator), checked against hand-computed values
on a scripted policy; the held-out evaluation's success by turn; the CLI writes the table, the per-benchmark JSON
and transcripts."""

from __future__ import annotations

import json
import math
import os

import pytest

from atgrpo.cli import main
from atgrpo.envs import make
from atgrpo.rollout import Sampling
from atgrpo.trainer.benchmarks import pass_at_k, run_benchmark
from atgrpo.trainer.evaluate import evaluate
from scripted import ScriptedBytePolicy


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 3, 2, 1.0), (5, 2, 3, 0.9), (10, 3, 5, 1 - 21 / 252),
    (1, 1, 1, 1.0), (20, 1, 20, 1.0),
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    product = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))  # the numerically stable form
    assert pass_at_k(n, c, k) == pytest.approx(product, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


class ScriptedPolicy(ScriptedBytePolicy):
    """Answers the plan agent of problem i with the expert path on the samples listed in ``wins[i]`` (sample j of
    a problem is the j-th copy of its prompt in a generate call) and with nothing otherwise; the tool says
    nothing. A stand-in for a model, so that the number of correct samples per problem is known."""

    def __init__(self, plan_prompts: dict[str, tuple[int, str]], wins: dict[int, set[int]]):
        super().__init__()
        self.plan_prompts, self.wins = plan_prompts, wins

    def answers(self, prompts, n):
        seen: dict[str, int] = {}
        out = []
        for text in prompts:
            j = seen[text] = seen.get(text, -1) + 1
            answer = ""
            if text in self.plan_prompts:
                i, expert = self.plan_prompts[text]
                answer = expert if j in self.wins[i] else ""
            out.append([answer] * n)
        return out


def test_pass_at_k_on_a_scripted_policy_equals_the_hand_computed_value():
    kw = dict(size=5, wall_prob=0.2, max_turns=1)
    make_env = lambda split, seed: _reset(make("plan_path", split=split, **kw), seed)  # noqa: E731
    plan_prompts = {}
    for i in range(3):
        env = make_env("eval", i)
        env.step("")  # the tool says nothing
        plan_prompts[env.observe()] = (i, env.expert_action("plan"))
        env.step(env.expert_action("plan"))
        assert env.success  # the expert path solves it in the one turn
    wins = {0: set(), 1: {2}, 2: {0, 1, 3}}  # c = 0, 1, 3 correct of n = 4
    policy = ScriptedPolicy(plan_prompts, wins)
    metrics, records = run_benchmark(make_env, {"shared": policy}, {"tool": "shared", "plan": "shared"}, 3,
                                     [1, 2, 4], Sampling(K=4, temperature=1.0, max_new_tokens=8, alpha=1.0))
    # by hand: pass@1 = (0 + 1/4 + 3/4) / 3; pass@2 = (0 + (1 - C(3,2)/C(4,2)) + 1) / 3 = (0 + 1/2 + 1) / 3;
    # pass@4 = (0 + 1 + 1) / 3
    assert metrics["pass@1"] == pytest.approx(1 / 3)
    assert metrics["pass@2"] == pytest.approx(0.5)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert metrics["success_rate"] == pytest.approx(4 / 12) and metrics["problems"] == 3.0
    assert [(r["seed"], r["sample"], r["success"]) for r in records] == [
        (i, j, j in wins[i]) for i in range(3) for j in range(4)]


class PromptScript(ScriptedBytePolicy):
    """Answers each prompt with ``script[prompt]`` (nothing for a prompt not in it)."""

    def __init__(self, script: dict[str, str]):
        super().__init__()
        self.script = script

    def answers(self, prompts, n):
        return [[self.script.get(text, "")] * n for text in prompts]


def test_solved_by_turn_counts_the_episodes_solved_within_each_turn():
    kw = dict(size=5, wall_prob=0.2, max_turns=3)
    make_env = lambda split, seed: _reset(make("plan_path", split=split, **kw), seed)  # noqa: E731
    solve_at = [1, 2, 3, None, 2]  # the turn at which the plan agent answers the expert path; None: never
    script = {}
    for i, turn in enumerate(solve_at):
        env = make_env("eval", i)
        for t in range(1, 4):
            env.step("")  # the tool says nothing
            answer = env.expert_action("plan") if t == turn else ""
            script[env.observe()] = answer
            env.step(answer)
            if env.done:
                break
        assert env.success == (turn is not None)
    metrics, episodes = evaluate(make_env, {"shared": PromptScript(script)}, {"tool": "shared", "plan": "shared"},
                                 len(solve_at), Sampling(K=1, temperature=0.0, max_new_tokens=8, alpha=1.0))
    assert [e.turns for e in episodes] == [1, 2, 3, 3, 2]
    assert metrics["success_rate"] == pytest.approx(4 / 5)
    assert metrics["solved_by_turn_1"] == pytest.approx(1 / 5) and metrics["solved_by_turn_2"] == pytest.approx(3 / 5)
    assert "solved_by_turn_3" not in metrics  # the last turn played: that is success_rate


def _reset(env, seed):
    env.reset(seed)
    return env


def test_cli_eval_of_several_benchmarks_writes_the_table_and_transcripts(tmp_path, fast_overrides, capsys):
    run = tmp_path / "run"
    assert main(["train", *fast_overrides, "warmstart.enabled=false", "train.steps=1", "eval.problems=2",
                 "--out", str(run), "--quiet"]) == 0
    problems = tmp_path / "sums.jsonl"
    problems.write_text("".join(json.dumps({"problem": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n"
                                for a in range(2)))
    capsys.readouterr()
    csv = tmp_path / "doubles.csv"
    csv.write_text("problem,answer\nWhat is 3 + 3?,6\n")
    code = main(["eval", str(run), "env.kwargs.size=4", "--benchmarks", f"run,sudoku,math:{problems},math:{csv}",
                 "--n", "2",
                 "--k", "1,2", "--temperature", "1.0", "--problems", "3", "--quiet"])
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0, captured.err
    assert "| benchmark | env | problems | n | pass@1 | pass@2 | success |" in printed
    out = run / "eval"
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["run", "sudoku", "math-sums", "math-doubles"]
    assert results["math-doubles"]["env_kwargs"]["dataset"] == "files" and results["math-doubles"]["metrics"][
        "problems"] == 1.0
    assert results["math-sums"]["metrics"]["problems"] == 2.0  # a 2-record file: each record once
    assert results["run"]["env_kwargs"]["size"] == 4 and results["sudoku"]["env"] == "sudoku"
    for name, r in results.items():
        m = r["metrics"]
        assert 0 <= m["pass@1"] <= m["pass@2"] <= 1 and m["samples"] == 2 * m["problems"]
        assert json.loads((out / f"{name}.json").read_text()) == r
        rows = [json.loads(x) for x in (out / f"{name}.transcripts.jsonl").read_text().splitlines()]
        assert len(rows) == m["samples"] and rows[0]["transcript"] and {"problem", "sample", "success"} <= set(rows[0])
        c = {}
        for row in rows:
            c[row["seed"]] = c.get(row["seed"], 0) + row["success"]
        assert m["pass@2"] == pytest.approx(sum(pass_at_k(2, x, 2) for x in c.values()) / len(c))
    assert (out / "results.md").read_text().count("\n| ") == 5  # header + 4 rows


@pytest.mark.parametrize("args, message", [
    (["--benchmarks", "nope"], "unknown benchmark 'nope'; choose from: run, humaneval"),
    (["--benchmarks", "run", "--n", "2"], "--n 2 samples at temperature 0 are identical"),
    (["--benchmarks", "run", "--n", "2", "--k", "3", "--temperature", "1"], "every k must be in 1..n"),
    (["--benchmarks", "math:/no/such.jsonl"], "no file '/no/such.jsonl'"),
    (["--n", "2"], "go with --benchmarks"),
    (["--benchmarks", "run", "--out", "{tmp}/c.yaml"], "is a file, not a directory"),
])
def test_cli_eval_bad_benchmark_settings_are_one_line(tmp_path, args, message, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("warmstart: {enabled: false}\nmodel: {tiny: {hidden_size: 32, num_layers: 1, num_heads: 2, "
                   "intermediate_size: 64}}\n")
    assert main(["eval", str(cfg), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_cli_eval_checks_every_argument_before_the_warm_start(tmp_path):
    """As a new user tries it: the quickstart (warm start on) with an unknown benchmark says so at once, in one
    line, before torch is even imported (so before any model is built or warm-started)."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    code = ("import sys; from atgrpo.cli import main; rc = main(['eval', sys.argv[1], '--benchmarks', 'nope']); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, os.path.join(repo, "configs/quickstart.yaml")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(err) == 1 and "unknown benchmark 'nope'" in err[0], proc.stderr[-2000:]
    assert proc.stdout == "no torch\n" and os.listdir(tmp_path) == []  # no eval_out/
