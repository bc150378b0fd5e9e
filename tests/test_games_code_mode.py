"""The games' tool agent as a programmer (tool_mode="code"): programs run in the sandbox, their printed line is
the proposal, failures are penalised and reported to both agents, the scripted expert's programs solve held-out
instances, and the tree still gives the K candidates of a node one prompt."""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict

import pytest
import yaml

import atgrpo
from atgrpo.algorithms.grouping import check_group_sizes, group_key_fn
from atgrpo.bench.experts import GAMES, expert_program_outcomes
from atgrpo.envs import MathEnv, make, programs
from atgrpo.envs.expert_programs import BUGS
from atgrpo.rollout import Sampling, tree_rollout
from atgrpo.sandbox import isolation
from atgrpo.trainer.step import rollout_metrics
from scripted import ScriptedBytePolicy

FORMAT_PENALTY = -1.0  # the games' penalty for an unreadable answer (and a failed program)
SMALL = {"plan_path": {"size": 5, "wall_prob": 0.2, "max_turns": 3}, "sokoban": {"size": 6, "max_turns": 3},
         "sudoku": {"size": 4, "max_turns": 3}}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(game: str, seed: int = 0, **kw):
    env = make(game, style="chat", **{**SMALL[game], **kw})
    env.reset(seed)
    return env


def _fenced(program: str) -> str:
    return f"Here is my program.\n```python\n{program}\n```\n"


def _text(messages) -> str:
    return "\n".join(m["content"] for m in messages)


# ---- modes ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("game", list(SMALL))
def test_default_mode_follows_the_prompt_style_and_bad_modes_fail(game):
    assert make(game, style="chat").tool_mode == "code"
    assert make(game, style="compact").tool_mode == "direct"
    assert make(game, style="chat", tool_mode="direct").tool_mode == "direct"
    with pytest.raises(ValueError, match="tool_mode"):
        make(game, tool_mode="python")
    direct = _env(game, tool_mode="direct")
    res = direct.step(direct.expert_action("tool"))  # a typed answer, not a program
    assert "program_crashed" not in res.info and direct.tool_run is None


# ---- the scripted expert ----------------------------------------------------------------------------------
@pytest.mark.parametrize("game", list(GAMES))
def test_expert_program_solves_held_out_instances_through_the_sandbox(game):
    out = expert_program_outcomes(game, 12)
    assert out["solved"] == 12 and out["crashed"] == 0, out


def test_expert_program_solves_9x9_sudoku_and_two_box_sokoban():
    assert expert_program_outcomes("sudoku", 4, {"size": 9, "tool_mode": "code"})["solved"] == 4
    assert expert_program_outcomes("sokoban", 4, {"num_boxes": 2, "tool_mode": "code"})["solved"] == 4


@pytest.mark.parametrize("game", list(SMALL))
def test_expert_program_holds_the_prompt_grid_and_no_solution(game):
    env = _env(game, seed=3)
    program = env.expert_program()
    prompt = _text(env.observe("tool"))
    grid = [ln for ln in program.split('"""')[1].strip().splitlines()]
    assert "\n".join(grid) in prompt  # the instance, copied from the prompt
    answer = programs.run_program(program, env.timeout).answer
    assert answer and answer not in program  # computed by the program, not written into it


@pytest.mark.parametrize("game", list(SMALL))
def test_noisy_expert_programs_fail_in_each_way(game):
    env = _env(game, seed=1)
    right = programs.run_program(env.expert_program(), env.timeout).answer
    runs = {}
    for bug in BUGS:
        twin = env.clone()
        runs[bug] = (twin.step(_fenced(env.expert_program(bug))).info, twin.tool_run)
    info, run = runs["crash"]
    assert info["program_crashed"] and "NameError" in run.stderr
    info, run = runs["silent"]
    assert info["program_unparsable"] and not info["program_crashed"] and run.answer is None
    info, run = runs["wrong"]
    assert not info["program_crashed"] and not info["program_unparsable"] and run.answer != right
    rng = random.Random(0)
    demos = [env.demo_action("tool", rng, 0.5) for _ in range(40)]
    assert 0 < sum(d == env.expert_action("tool") for d in demos) < 40  # some carry a bug, some do not
    assert all(env.demo_action("tool", rng, 0.0) == env.expert_action("tool") for _ in range(3))


def _proposal_solves(env) -> bool:
    twin = env.clone()
    twin.step(env.tool_run.answer or "")
    return twin.success


# ---- failures: penalised, shown to both agents ------------------------------------------------------------
@pytest.mark.parametrize("game", list(SMALL))
def test_crashing_program_is_penalised_and_its_stderr_reaches_both_agents(game):
    env = _env(game)
    res = env.step(_fenced("print('RRDD')\nraise ValueError('boom 4242')"))
    assert res.reward.local == FORMAT_PENALTY and res.reward.team == 0.0
    assert res.info["program_crashed"] and not res.info["program_timed_out"] and env.proposal is None
    assert "boom 4242" in res.info["stderr"] and res.info["stdout"] == "RRDD\n"  # the feedback, in the rollouts
    plan_prompt = _text(env.observe("plan"))
    assert "boom 4242" in plan_prompt and "exit code 1" in plan_prompt and "no proposal" in plan_prompt
    assert "E:ValueError" in env.observe("plan", style="compact")
    env.step(env.expert_action("plan"))
    if not env.done:
        tool_prompt = _text(env.observe("tool"))
        assert "boom 4242" in tool_prompt and "raise ValueError('boom 4242')" in tool_prompt


@pytest.mark.parametrize("game", list(SMALL))
def test_timeout_and_silence_are_penalised_and_reported(game):
    env = _env(game, timeout=0.5)
    res = env.clone().step(_fenced("while True:\n    pass"))
    assert res.reward.local == FORMAT_PENALTY and res.info["program_timed_out"] and res.info["program_crashed"]
    twin = env.clone()
    twin.step(_fenced("while True:\n    pass"))
    assert "timed out after 0.5 s" in _text(twin.observe("plan"))
    twin = env.clone()
    res = twin.step(_fenced("x = 1"))
    assert res.reward.local == FORMAT_PENALTY and res.info["program_unparsable"] and not res.info["program_crashed"]
    assert "printed nothing" in _text(twin.observe("plan")) and "E:empty" in twin.observe("plan", style="compact")
    twin = env.clone()
    res = twin.step(_fenced("print('hello world')"))
    assert res.reward.local == FORMAT_PENALTY and res.info["program_unparsable"] and twin.proposal is None
    assert "no readable proposal: hello world" in _text(twin.observe("plan"))
    assert "E:unreadable" in twin.observe("plan", style="compact")
    res = env.clone().step("no code at all, just words")
    assert res.reward.local == FORMAT_PENALTY and res.info["program_crashed"]


@pytest.mark.parametrize("game", list(SMALL))
def test_printed_answer_is_simulated_and_scored_as_the_same_typed_answer(game):
    """A program that prints a wrong answer is scored exactly like that answer typed in direct mode."""
    env = _env(game, seed=2)
    direct = _env(game, seed=2, tool_mode="direct")
    coded = env.clone()
    res = coded.step(_fenced(env.expert_program("wrong")))
    printed = coded.tool_run.answer
    assert printed and not res.info["program_crashed"]
    typed = direct.step(printed)
    assert (res.reward, coded.proposal) == (typed.reward, direct.proposal)
    assert coded.proposal is not None and not _proposal_solves(coded)


def test_wrong_path_program_is_simulated_as_a_wrong_path():
    env = _env("plan_path", seed=4)
    start = env.pos
    res = env.step(_fenced("print('U' * 3 + 'L')"))
    end, local, _ = env.simulate(start, list("UUUL"))
    assert env.proposal == ("UUUL", end, end == env.goal) and res.reward.local == pytest.approx(local)
    assert env.pos == start  # the tool's proposal is simulated on a copy, never executed
    assert "Tool agent proposed [U, U, U, L]" in _text(env.observe("plan"))


# ---- what a program can reach -----------------------------------------------------------------------------
@pytest.mark.skipif(not isolation().namespaces, reason="the sandbox cannot isolate programs on this machine")
def test_program_cannot_import_atgrpo_or_read_the_env_files():
    package = os.path.dirname(os.path.abspath(atgrpo.__file__))
    probe = f"""
import os, sys
found = []
try:
    import atgrpo
    found.append("import")
except Exception:
    pass
sys.path.insert(0, {os.path.dirname(package)!r})
try:
    from atgrpo.envs.plan_path import bfs_path
    found.append("import-from-path")
except Exception:
    pass
for path in ({os.path.join(package, "envs", "plan_path.py")!r}, {os.path.join(package, "envs", "sokoban.py")!r}):
    try:
        open(path).read()
        found.append("read " + path)
    except Exception:
        pass
try:
    found += os.listdir({package!r})  # empty where atgrpo is covered; absent in a checkout under a covered /tmp
except FileNotFoundError:
    pass
print("found:", found)
print("R")
"""
    env = _env("plan_path")
    env.step(_fenced(probe))
    assert env.tool_run.exit_code == 0 and "found: []" in env.tool_run.stdout, env.tool_run.stdout
    assert os.path.exists(os.path.join(package, "envs", "plan_path.py"))  # hidden only inside the sandbox


# ---- one cache, one prompt per node -----------------------------------------------------------------------
def test_identical_programs_run_once_in_the_one_shared_cache():
    programs.clear_cache()
    env = _env("sokoban", seed=5)
    text = env.expert_action("tool")
    children = [env.clone() for _ in range(4)]
    results = [c.step(text) for c in children]
    assert len(programs._cache) == 1 and len({r.reward for r in results}) == 1
    math = MathEnv(style="chat")
    math.reset(0)
    math.step(math.expert_action("tool"))
    assert len(programs._cache) == 2  # the math tool's program lands in the same cache


class ChatScript(ScriptedBytePolicy):
    """Test double with the policy interface the rollout uses: renders chat messages as plain text and answers
    branch k with ``script(prompt_text, k)``, so that the K candidates of a node differ."""

    def __init__(self, policy_id, script):
        super().__init__(policy_id)
        self.script = script

    def render(self, prompt):
        return _text(prompt)

    def answers(self, prompts, n):
        return [[self.script(t, k) for k in range(n)] for t in prompts]


@pytest.mark.parametrize("game", list(SMALL))
def test_k_candidates_of_a_node_see_one_prompt_in_code_mode(game):
    K = 4
    envs = [_env(game, seed=s, max_turns=1) for s in (0, 1)]

    def tool(prompt, k):  # branch 0 crashes, 1 prints nothing, 2 prints a wrong answer, 3 is the expert
        if k < 2:
            return ["```python\nraise RuntimeError('no')\n```", "```python\nx = 1\n```"][k]
        env = next(e for e in envs if _text(e.observe("tool")) == prompt)  # one turn: the reset state
        return _fenced(env.expert_program("wrong" if k == 2 else None))

    policies = {"t": ChatScript("t", tool), "p": ChatScript("p", lambda prompt, k: "[U]")}
    samples, episodes = tree_rollout(envs, policies, {"tool": "t", "plan": "p"}, Sampling(K=K, temperature=1.0,
                                     max_new_tokens=8, alpha=1.0))
    check_group_sizes([group_key_fn("problem_turn_agent")(s) for s in samples], K)
    nodes = defaultdict(list)
    for s in samples:
        nodes[(s.problem, s.turn, s.agent)].append(s)
    for node in nodes.values():
        assert len({s.prompt for s in node}) == 1 and len({tuple(s.prompt_ids) for s in node}) == 1
    first_tool = nodes[(envs[0].problem_id, 0, "tool")]
    assert [s.info["program_crashed"] for s in first_tool] == [True, False, False, False]
    assert [s.info["program_unparsable"] for s in first_tool] == [False, True, False, False]
    assert [s.reward_local for s in first_tool][:2] == [FORMAT_PENALTY, FORMAT_PENALTY]
    assert first_tool[3].selected  # the expert program's proposal scores best
    m = rollout_metrics(samples, episodes)
    assert m["rollout/program_crashed_rate/tool"] == pytest.approx(0.25)
    assert m["rollout/program_unparsable_rate/tool"] == pytest.approx(0.25)
    assert m["rollout/program_timed_out_rate/tool"] == 0.0 and "rollout/program_crashed_rate/plan" not in m


def test_bench_experts_cli(tmp_path, capsys):
    from atgrpo.cli import main

    assert main(["bench", "experts", "--problems", "3", "--tasks", "sudoku", "--out", str(tmp_path)]) == 0
    assert "| sudoku | 3 | 3 (100%) | 0 | 0 |" in capsys.readouterr().out
    saved = json.loads((tmp_path / "experts.json").read_text())
    assert saved["command"].startswith("atgrpo bench experts") and saved["rows"][0]["solved"] == 3
    assert main(["bench", "experts", "--tasks", "sudoku,chess", "--out", str(tmp_path / "x")]) == 2
    assert "chess" in capsys.readouterr().err and not (tmp_path / "x").exists()


# ---- configs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("game", list(GAMES))
def test_chat_code_configs_are_the_bench_settings(game):
    with open(os.path.join(ROOT, "configs", f"{game}_chat_code.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["env"] == {"name": game, "style": "chat", "kwargs": GAMES[game]}


@pytest.mark.parametrize("game", GAMES)
def test_plan_answering_with_a_program_is_a_format_error_that_moves_nothing(game):
    """The plan's answer is an action: a python block (here the expert's own program, whose text holds the grid
    a parser could read as a no-op answer) scores the format penalty and leaves the real state as it was; the
    same answer typed without the program is executed."""
    env = _env(game, seed=1)
    env.step(_fenced(env.expert_program()))  # the tool's turn: a solving proposal
    before = env.clone()
    res = env.step(_fenced(env.expert_program()))
    assert res.reward.local == FORMAT_PENALTY and res.reward.team == 0.0
    assert res.info["plan_wrote_program"] and not env.success
    typed = before.step(before.expert_action("plan"))
    assert typed.reward.team == 1.0 and before.success
    assert programs.has_python_block("```py\nprint(1)") and not programs.has_python_block("```\n1234/3412\n```")
