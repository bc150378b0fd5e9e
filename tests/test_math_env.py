"""Math environment: contract, scripted episodes, agreement by equivalence, crashing programs, splits, JSONL
loader, hand-checked rewards, and the exception-safe math-verify wrapper."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from atgrpo.envs import MathEnv, check_env, make, registered
from atgrpo.envs import splits
from atgrpo.envs.math_data import (draw_problem, equivalent, fingerprint, is_correct, is_safe,
                                   last_boxed, load_jsonl, parse_answer)
from atgrpo.envs.math_env import FORMAT_PENALTY
from atgrpo.envs.programs import extract_code
from atgrpo.envs.registry import JUNK_ACTIONS


def _jsonl(tmp_path, records, name="aime.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def _arith(style="chat", **kw):
    env = MathEnv(style=style, **kw)
    env.reset(0)
    return env, env.problem.answer


# ---- contract ---------------------------------------------------------------------------------------------
def test_registered():
    assert "math" in registered() and isinstance(make("math"), MathEnv)


@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("kwargs", [{}, {"roles": ("reasoner",)}, {"split": "eval"}, {"dataset": "gsm"}])
def test_check_env(style, kwargs):
    check_env(MathEnv(style=style, **kwargs), seed=3, episodes=2)


def test_check_env_jsonl(tmp_path):
    path = _jsonl(tmp_path, [{"problem": "What is 1/2 + 0?", "answer": "\\frac{1}{2}"},
                             {"problem": "2+2?", "answer": 4}])
    for style in ("compact", "chat"):
        check_env(MathEnv(dataset="jsonl", data_path=path, split="eval", style=style), seed=0, episodes=2)


def test_reset_is_deterministic_and_fast():
    env = MathEnv(dataset_kwargs={"max_terms": 3})
    env.reset(11)
    first = (env.problem, env.observe())
    env.reset(12)
    env.reset(11)
    assert (env.problem, env.observe()) == first
    times = []
    for seed in range(200):
        t = time.perf_counter()
        env.reset(seed)
        times.append(time.perf_counter() - t)
    assert statistics.median(times) < 0.005


def test_bad_arguments():
    with pytest.raises(ValueError, match="arithmetic"):
        MathEnv(dataset="nope")
    with pytest.raises(ValueError, match="reasoner"):
        MathEnv(roles=("tool",))
    with pytest.raises(ValueError, match="data_path"):
        MathEnv(dataset="jsonl")


# ---- scripted episodes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("dataset", ["arithmetic", "gsm"])
def test_experts_succeed_in_turn_zero(style, dataset):
    env = MathEnv(dataset=dataset, style=style, split="eval")
    for seed in range(8):
        env.reset(seed)
        r_tool = env.step(env.expert_action("tool"))
        assert (r_tool.reward.local, r_tool.reward.team) == (1.0, 0.0) and not r_tool.done, r_tool.info
        r = env.step(env.expert_action("reasoner"))
        assert (r.reward.local, r.reward.team) == (1.0, 1.0)
        assert r.terminated and not r.truncated and env.success and env.turn == 1 and r.info["agree"]


def test_disagreement_is_shown_in_both_next_prompts():
    env, gold = _arith("chat")
    wrong = str(int(gold) + 1)
    env.step(f"Compute it.\n```python\nprint('working')\nprint({wrong})\n```")
    r = env.step(f"Step by step... \\boxed{{{gold}}}")
    assert not r.done and r.info["correct"] and not r.info["agree"] and env.turn == 1
    for agent in ("tool", "reasoner"):
        text = env.observe(agent)[1]["content"]
        assert f"print({wrong})" in text and "working" in text and "exit code 0" in text  # solution + execution
        assert f"(last printed line): {wrong}" in text and f"answer: {gold}" in text  # both answers
        assert "do not agree" in text
    compact = env.observe("tool", style="compact")
    assert compact.startswith("T1 Q:") and f"T:{wrong} R:{gold}" in compact and compact.endswith("\n>")
    assert not env.success  # not over yet: success is the reasoner's *final* answer


def test_agreement_uses_equivalence_not_strings(tmp_path):
    path = _jsonl(tmp_path, [{"problem": "Half of one?", "answer": "1/2"}])
    for tool, reasoner in [("print(1/2)", "\\boxed{\\frac{1}{2}}"), ("print('1/2')", "\\boxed{0.5}"),
                           ("print(0.5)", "\\boxed{1/2}"), ("print('\\\\frac{1}{2}')", "\\boxed{0.50}")]:
        env = MathEnv(dataset="jsonl", data_path=path, split="eval")
        env.reset(0)
        env.step(tool)
        r = env.step(f"So the answer is {reasoner}.")
        assert r.terminated and r.info["agree"] and env.success, (tool, reasoner, r.info)
    for a, b in [("1/2", "0.5"), ("0.5", "\\frac{1}{2}"), ("1/2", "\\frac{1}{2}")]:
        assert equivalent(a, b) and equivalent(b, a) and equivalent(a, b, numeric=True)
    assert not equivalent("1/2", "0.6") and not equivalent("2", None)


def test_agreeing_on_a_wrong_answer_ends_the_episode_unsuccessfully():
    env, gold = _arith("compact")
    wrong = str(int(gold) - 3)
    env.step(f"print({wrong})")
    r = env.step(f"\\boxed{{{wrong}.0}}")
    assert r.terminated and r.info["agree"] and not env.success
    assert (r.reward.local, r.reward.team) == (0.0, 0.0)


def test_tool_coming_round_ends_before_the_reasoners_next_turn():
    env, gold = _arith("compact")
    env.step("print(0.25)")
    env.step(f"\\boxed{{{gold}}}")
    r = env.step(f"print({gold})")  # turn 1, tool now agrees with the reasoner's turn-0 answer
    assert r.terminated and env.current_agent is None and env.success
    assert (r.reward.local, r.reward.team) == (1.0, 1.0)


def test_turn_limit_truncates_and_judges_the_final_answer():
    env, gold = _arith("compact", max_turns=2)
    for reasoner in (f"\\boxed{{{gold}}}", "no idea"):
        env.step("print('x')")
        r = env.step(reasoner)
    assert r.truncated and not r.terminated and not env.success  # the correct turn-0 answer is not final


def test_single_agent_ends_on_its_first_parsable_answer():
    env, gold = _arith("compact", roles=("reasoner",))
    assert env.observe().startswith("R0 Q:")
    r = env.step("hmm")
    assert not r.done and r.reward.local == -FORMAT_PENALTY and env.observe().endswith("R:?\n>")
    r = env.step(f"\\boxed{{{gold}}}")
    assert r.terminated and env.success and (r.reward.local, r.reward.team) == (1.0, 1.0)


# ---- crashing programs ------------------------------------------------------------------------------------
def test_crashing_tool_is_reported_not_raised():
    env, _ = _arith("chat")
    r = env.step("```python\nx = 1/0\nprint(x)\n```")
    assert r.info["crashed"] and r.info["exit_code"] == 1 and r.info["parse_error"]
    assert "ZeroDivisionError" in r.info["stderr"] and r.info["stdout"] == ""  # the feedback, in the rollouts
    assert r.reward.local == -FORMAT_PENALTY
    text = env.observe("reasoner")[1]["content"]
    assert "ZeroDivisionError" in text and "exit code 1" in text and "none (nothing printed)" in text
    assert "atgrpo-sbx" not in text  # sandbox paths removed: prompts stay reproducible
    assert "T:? E:ZeroDivisionError" in env.observe("reasoner", style="compact")


def test_infinite_loop_times_out_and_is_reported():
    env, _ = _arith("chat", timeout=0.3)
    t = time.monotonic()
    r = env.step("```python\nwhile True:\n    pass\n```")
    assert time.monotonic() - t < 5 and r.info["timed_out"] and r.info["crashed"]
    assert "timed out after 0.3 s" in env.observe("reasoner")[1]["content"]
    assert "E:timeout" in env.observe("reasoner", style="compact")


def test_code_extraction():
    text = "Try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code(text)[0].strip() == "print(2)"
    assert extract_code("print(3)") == ("print(3)", False)
    assert extract_code("```py\nprint(4)")[0].strip() == "print(4)"  # unterminated last block
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{12") is None and last_boxed("nothing") is None


# ---- rewards by hand --------------------------------------------------------------------------------------
def test_rewards_by_hand():
    env, gold = _arith("compact")
    r = env.step(f"print({gold})\n1/0")  # right answer printed, then a crash: 1.0 - 0.1
    assert r.reward.local == pytest.approx(0.9) and r.reward.team == 0.0 and r.info["correct"]
    r = env.step("I think it is 5")  # no \boxed{}: 0 - 0.1; the reasoner has no answer: team 0
    assert r.reward.local == pytest.approx(-0.1) and r.reward.team == 0.0 and r.info["parse_error"]
    r = env.step("print(7 * 11 + 0.5)")  # wrong but clean: 0
    assert (r.reward.local, r.reward.team) == (0.0, 0.0)
    r = env.step(f"\\boxed{{{env.problem.expression}}}")  # restating the question is not a number: refused
    assert r.reward.local == pytest.approx(-0.1) and r.info["parse_error"]
    env2, gold = _arith("compact")
    env2.step("")  # no code at all: crashed + no answer, one penalty
    assert env2.last["tool"].crashed
    r = env2.step(f"\\boxed{{{gold}}}")
    assert (r.reward.local, r.reward.team) == (1.0, 1.0) and not r.done  # the tool has no answer: no agreement


# ---- data -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["arithmetic", "gsm"])
def test_splits_are_disjoint(dataset):
    train = {fingerprint(draw_problem(dataset, s, "train")) for s in range(200)}
    evals = {fingerprint(draw_problem(dataset, s, "eval")) for s in range(200)}
    assert len(train) > 150 and len(evals) > 150
    assert not train & evals
    assert all(splits.split_of(f) == "eval" for f in evals) and all(splits.split_of(f) == "train" for f in train)


def test_arithmetic_golds_are_exact():
    for s in range(100):
        p = draw_problem("arithmetic", s, "train")
        assert eval(p.expression.replace("/", "//")) == int(p.answer)  # noqa: S307 -- generated arithmetic
        assert p.compact == f"{p.expression}=?"


def test_jsonl_loader(tmp_path):
    records = [{"problem": "Find x.", "answer": "\\sqrt{2}", "id": "a"}, {"problem": "AIME 1", "answer": 204}]
    path = _jsonl(tmp_path, records)
    probs = load_jsonl(path)
    assert [(p.question, p.answer) for p in probs] == [("Find x.", "\\sqrt{2}"), ("AIME 1", "204")]
    env = MathEnv(dataset="jsonl", data_path=path, split="eval")
    env.reset(3)
    assert env.problem.answer == "204" and env.problem_id == "math/jsonl/eval/3"
    env.reset(0)
    assert not env.numeric and env.step("print('sqrt(2)')").info["correct"]  # symbolic gold, math-verify
    assert env.step("\\boxed{\\frac{2}{\\sqrt{2}}}").info["correct"] and env.success
    with pytest.raises(ValueError, match="evaluation problems only"):
        MathEnv(dataset="jsonl", data_path=path).reset(0)
    bad = _jsonl(tmp_path, [{"problem": "x"}], name="bad.jsonl")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*'answer'"):
        load_jsonl(bad)


def test_missing_jsonl_names_the_path_and_layout(tmp_path):
    missing = str(tmp_path / "aime24.jsonl")
    with pytest.raises(FileNotFoundError, match="aime24.jsonl") as err:
        MathEnv(dataset="jsonl", data_path=missing, split="eval")
    assert '"problem"' in str(err.value) and '"answer"' in str(err.value)


# ---- the math-verify wrapper ------------------------------------------------------------------------------
def test_guard_refuses_runaway_inputs_quickly():
    for s in ["10**10**10", "$9^{9^{9^{9}}}$", "10^{10^{10}}", "(10^{100})!", "100000000000000!", "2^{10^{8}}",
              "\\binom{10000000}{5000000}", "\\sum_{k=1}^{999} k^{999}", "1" * 300, "((9^{999})^{999})^{999}",
              "\\left(2^{999}\\right)^{999}", "e^{e^{e^{99}}}"]:
        t = time.monotonic()
        assert not is_safe(s) and parse_answer(s) is None and not is_correct("1", s), s
        assert time.monotonic() - t < 1.0
    for s in ["2^{10}", "x^2+y^2", "(x+1)^2+(y-1)^2", "\\frac{\\sqrt{3}}{2}", "-204", "3\\sqrt{2}", "5"]:
        assert is_safe(s), s


def test_wrapper_never_raises_on_junk():
    for s in JUNK_ACTIONS + ["\\frac{", "$$", "}{", "\\Gamma(100000)", "nan", "inf", "[1,2", "\\left(", "\x00"]:
        parse_answer(s)
        parse_answer(s, numeric=True)
        is_correct("1/2", s)
        equivalent(s, "0.5")
    assert parse_answer("12+7*3") is not None and parse_answer("12+7*3", numeric=True) is None
    assert is_correct("1000", "1,000", numeric=True) and is_correct("0.001", "1e-3", numeric=True)
    assert is_correct("288", "\\$288", numeric=True) and not is_correct("288", "288 apples", numeric=True)
