"""The code environment: contract, scripted coder/tester episodes, tester rewards, comparison and parsing rules,
HumanEval, JSONL files, train/eval disjointness, and programs that crash or never stop."""

import json
import random

import pytest

from atgrpo.envs import check_env, make
from atgrpo.envs.code import EXPOSE_BONUS, FORMAT_PENALTY
from atgrpo.envs.code_data import Problem, generated_problem, run_trusted
from atgrpo.envs.code_exec import format_tests, outputs_match, parse_tests
from atgrpo.envs.programs import extract_code

# A hand-made problem: sum of two integers. WRONG_ABS is right only when both numbers are >= 0.
SUM2 = Problem(pid="sum2", statement="Read two integers a and b on one line. Print a + b.",
               tests=(("1 2\n", "3\n"), ("-5 2\n", "-3\n"), ("10 10\n", "20\n"), ("-1 -1\n", "-2\n")),
               reference="a, b = map(int, input().split())\nprint(a + b)\n", examples=(("2 3\n", "5\n"),),
               tester_tests=(("4 5\n", "9\n"), ("-4 1\n", "-3\n")))
WRONG_ABS = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def sum2_env(**kwargs):
    env = make("code", **kwargs)
    env.reset(0)
    env.problem = SUM2
    return env


@pytest.mark.parametrize("style", ["compact", "chat"])
def test_check_env_both_styles_and_single_agent(style):
    check_env(make("code", style=style), seed=0, episodes=2)
    check_env(make("code", style=style, roles=("coder",)), seed=3, episodes=1)


def test_correct_program_succeeds_with_team_reward_one():
    env = make("code")
    env.reset(11)
    r = env.step(env.expert_action("coder"))
    assert env.success and r.terminated and r.reward.team == 1.0 and r.reward.local == 1.0
    assert r.info["pass_ratio"] == 1.0 and not r.info["parse_error"]


@pytest.mark.parametrize("style", ["chat", "compact"])
def test_wrong_program_mismatches_reach_both_roles_next_prompts(style):
    env = sum2_env(style=style)
    r = env.step(WRONG_ABS)
    assert r.reward.local == r.reward.team == pytest.approx(0.5) and not r.done  # 2 of 4 hidden tests
    r = env.step(format_tests([("-7 3", "-4")]))
    assert r.info["exposing"] == 1 and not r.done
    coder_prompt = str(env.observe("coder"))
    env.step(WRONG_ABS)  # the coder does not fix it; the tester's turn-2 prompt shows the same mismatch
    tester_prompt = str(env.observe("tester"))
    for prompt in (coder_prompt, tester_prompt):
        for piece in ("-7 3", "-4", "10"):  # input, expected, got
            assert piece in prompt, (piece, prompt)


def test_tester_rewards_valid_invalid_and_exposing():
    def tester_reward(tests, coder=WRONG_ABS):
        env = sum2_env()
        env.step(coder)
        return env.step(tests if isinstance(tests, str) else format_tests(tests))

    valid_not_exposing = tester_reward([("1 2", "3"), ("4 4", "8")])
    exposing = tester_reward([("1 2", "3"), ("-4 1", "-3")])
    invalid = tester_reward([("1 2", "4"), ("4 4", "9")])
    half = tester_reward([("1 2", "3"), ("4 4", "9")])
    junk = tester_reward("I think the program is fine.")
    assert valid_not_exposing.reward.local == pytest.approx(1.0)
    assert exposing.reward.local == pytest.approx(1.0 + EXPOSE_BONUS)
    assert exposing.reward.local > valid_not_exposing.reward.local
    assert invalid.reward.local == 0.0 and invalid.info["valid"] == 0
    assert half.reward.local == pytest.approx(0.5)
    assert junk.reward.local == FORMAT_PENALTY and junk.info["parse_error"]
    # the wrong program passes every valid case: the team agrees and the episode ends (not a success)
    assert valid_not_exposing.terminated and not valid_not_exposing.info["success"]
    assert not exposing.done and not invalid.done  # invalid cases alone never end the episode
    # a crashing program is exposed by any valid case
    assert tester_reward([("1 2", "3")], coder="```python\nraise SystemExit(3)\n```").info["exposing"] == 1


def test_output_comparison_tolerates_whitespace_and_floats():
    assert outputs_match("1 2 3\n", "1  2\n3   \n\n")
    assert outputs_match("0.3333333333", "0.333333")  # within 1e-6 relative
    assert outputs_match("1e-9", "0")  # within 1e-6 absolute
    assert not outputs_match("0.3333", "0.3334")
    assert not outputs_match("1 2", "1 2 3") and not outputs_match("YES", "yes") and not outputs_match("5", "")
    assert outputs_match("[1, 2.0]", "[1,2.0000000001]", function_mode=True)
    assert not outputs_match("True", "1", function_mode=True) and not outputs_match("(1,)", "[1]", True)


def test_parsing_code_and_tests_is_robust():
    assert extract_code("x\n```python\nprint(1)\n```\n```python\nprint(2)\n```")[0] == "print(2)\n"
    assert extract_code("```python\nprint(3)\n")[0] == "print(3)\n"  # unclosed fence
    assert extract_code("print(4)") == ("print(4)", False)
    tests, info = parse_tests("**Input:** 1 2\n**Output:** 3\n\nInput:\n```\n4\n5\n```\nExpected output: 9\n")
    assert tests == [("1 2\n", "3"), ("4\n5\n", "9")] and info["test_format"] == "labels"
    tests, info = parse_tests('here: [{"input": "1 2\\n", "output": "3"}, {"input": 7, "output": 8}]')
    assert tests == [("1 2\n", "3"), ("7\n", "8")] and info["test_format"] == "json"
    for junk in ["", "[", "[{]", "**Input:** only", "x" * 100_000, '[{"input": 1}]']:
        assert parse_tests(junk)[0] == []
    assert len(parse_tests(format_tests([("1", "1")] * 9))[0]) == 5


def test_humaneval_canonical_passes_and_wrong_completion_fails():
    env = make("code", dataset="humaneval", split="eval")
    for seed in (0, 13, 53):
        env.reset(seed)
        r = env.step(env.expert_action("coder"))
        assert env.success and r.reward.team == 1.0, env.problem.pid
    env.reset(0)  # a whole function with a __future__ import and a __main__ block (skipped, as in HumanEval)
    r = env.step("```python\nfrom __future__ import annotations\ndef has_close_elements(numbers, threshold):\n"
                 "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
                 "if __name__ == '__main__':\n    print(input())\n```")
    assert env.success
    env.reset(0)
    r = env.step("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert not env.success and r.reward.local == 0.0
    r = env.step(env.expert_action("tester"))  # calls with the canonical results: valid, and some expose it
    assert r.info["valid"] == r.info["tests"] > 0 and r.info["exposing"] > 0
    assert "Got:" in env.observe("coder")[1]["content"]
    with pytest.raises(ValueError, match="split='eval'"):
        make("code", dataset="humaneval").reset(0)


@pytest.mark.slow
def test_humaneval_all_164_canonical_solutions_pass_in_the_sandbox():
    """The sandbox's minimal root holds everything HumanEval's reference solutions need (standard library
    only): each of the 164 passes its hidden tests there."""
    env = make("code", dataset="humaneval", split="eval", cache=False)
    solved = set()
    for seed in range(164):
        env.reset(seed)
        env.step(env.expert_action("coder"))
        assert env.success, env.problem.pid
        solved.add(env.problem.pid)
    assert len(solved) == 164


def test_jsonl_loader_and_missing_file(tmp_path):
    path = tmp_path / "probs.jsonl"
    records = [{"question": "Print the double of the integer n.", "inputs": ["2\n", "5\n"], "outputs": ["4", "10"],
                "solution": "print(2 * int(input()))"},
               {"question": "Print n + 1.", "inputs": ["1\n"], "outputs": ["2"], "solution": "print(int(input())+1)"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    env = make("code", dataset="jsonl", data_path=str(path), split="eval")
    env.reset(2)  # seed % 2 -> the first record
    assert env.problem.statement == records[0]["question"]
    r = env.step("```python\nprint(int(input()) * 2)\n```")
    assert env.success and r.terminated
    env.reset(1)
    env.step("print(0)")
    assert env.step(format_tests([("3", "4")])).info["exposing"] == 1
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*question.*inputs.*outputs"):
        make("code", dataset="jsonl", data_path=str(tmp_path / "nope.jsonl"))
    no_solution = tmp_path / "nosol.jsonl"
    no_solution.write_text(json.dumps({"question": "q", "inputs": ["1"], "outputs": ["1"]}) + "\n")
    with pytest.raises(ValueError, match="solution"):
        make("code", dataset="jsonl", data_path=str(no_solution))
    make("code", dataset="jsonl", data_path=str(no_solution), roles=("coder",)).reset(0)  # fine without tester
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "inputs": ["1"]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        make("code", dataset="jsonl", data_path=str(bad))


def test_generator_is_seeded_and_train_eval_disjoint():
    train = {generated_problem(s, "train").statement for s in range(200)}
    evals = {generated_problem(s, "eval").statement for s in range(200)}
    assert not train & evals
    assert len(train) > 50 and len(evals) > 30
    a, b = generated_problem(7, "train"), generated_problem(7, "train")
    assert a == b and 5 <= len(a.tests) <= 10
    for p in (a, generated_problem(8, "eval")):  # the hidden tests are the reference's own outputs
        assert all(run_trusted(p.reference, i) == o for i, o in p.tests)


def test_crashing_and_endless_programs_are_reported_not_raised():
    env = sum2_env(timeout=0.5)
    r = env.step("```python\nwhile True:\n    pass\n```")
    assert r.reward.local == 0.0 and not env.success
    env.step(format_tests([("1 2", "3")]))
    assert "<timed out>" in env.observe("coder")[1]["content"]
    env = sum2_env(roles=("coder",))
    env.step("```python\nimport sys\nprint(1 / 0)\n```")  # single agent: feedback from the public examples
    assert "ZeroDivisionError" in env.observe("coder")[1]["content"]
    env = sum2_env()
    r = env.step("```python\ndef f(:\n```")
    assert r.reward.local == FORMAT_PENALTY and r.info["parse_error"]
    r = env.step(format_tests([("1 2", "3")]))
    assert r.info["exposing"] == 1 and "SyntaxError" in env.observe("coder")[1]["content"]


def test_demo_action_is_a_noisy_expert():
    env = sum2_env()
    rng = random.Random(0)
    assert env.demo_action("coder", rng, 0.0) == env.expert_action("coder")
    assert env.demo_action("tester", rng, 0.0) == env.expert_action("tester")
    assert env.demo_action("tester", rng, 1.0) != env.expert_action("tester")


def test_a_sibling_mistake_is_another_statements_program_from_the_same_template():
    """demo_mistake='sibling': the scripted coder's mistake is the reference of another problem of the same
    template (drawn by ``sibling_program`` from the demonstration's generator), a program that runs and solves
    something else, so the hidden tests fail and the episode goes on to a second coder turn."""
    from atgrpo.envs.code_data import sibling_program

    with pytest.raises(ValueError, match="demo_mistake"):
        make("code", demo_mistake="typo")
    for seed in range(6):
        env = make("code", split="train", demo_mistake="sibling", cache=False)
        env.reset(seed)
        problem, rng = env.problem, random.Random(seed)
        wrong = env.demo_action("coder", rng, 1.0)
        replay = random.Random(seed)
        replay.random()  # the noise draw
        sibling = sibling_program(problem, replay).rstrip()
        assert extract_code(wrong)[0].rstrip() == sibling != problem.reference.rstrip()
        r = env.step(wrong)
        assert r.info.get("parse_error") is not True and env.hidden_pass < 1.0
    line = make("code", split="train", cache=False)  # the default: one line of the reference lost
    line.reset(0)
    dropped = extract_code(line.demo_action("coder", random.Random(1), 1.0))[0].rstrip().split("\n")
    assert len(dropped) == len(line.problem.reference.rstrip().split("\n")) - 1
    assert sibling_program(Problem("x", "s", (), "print(1)"), random.Random(0)) is None  # no template


def test_declared_packages_reach_the_sandbox_and_only_then(tmp_path):
    """env.kwargs.packages: the code task's programs may import what the task declares, nothing else."""
    pytest.importorskip("yaml")
    from atgrpo.sandbox import isolation
    if not isolation().namespaces:
        pytest.skip("the minimal root needs namespaces")
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"question": "Print the double of n.", "inputs": ["2\n", "5\n"],
                                "outputs": ["4", "10"], "solution": "print(2 * int(input()))"}) + "\n")
    program = "```python\nimport yaml\nprint(int(input()) * 2)\n```"
    for packages, solved in ((None, False), (["yaml"], True)):
        env = make("code", dataset="jsonl", data_path=str(path), split="eval", cache=False, packages=packages)
        env.reset(0)
        env.step(program)
        assert env.success is solved, packages
