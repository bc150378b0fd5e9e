"""Sokoban and Sudoku environments: contract, solvability, uniqueness, splits, hand-checked rewards."""

from __future__ import annotations

import pytest

from atgrpo.envs import SokobanEnv, SudokuEnv, check_env, make, registered
from atgrpo.envs.registry import JUNK_ACTIONS
from atgrpo.envs.sokoban import Room
from atgrpo.envs.sudoku import count_solutions, parse_action, slash


def _border(size: int) -> frozenset:
    return frozenset((r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1))


def _set_sokoban(env: SokobanEnv, goals, player, boxes) -> None:
    """Replace the generated room by a hand-made open 6x6 room (border walls only)."""
    env.room = Room(6, _border(6), frozenset(goals))
    env.player, env.boxes = player, tuple(sorted(boxes))


# ---- contract ---------------------------------------------------------------------------------------------
def test_registered():
    assert {"sokoban", "sudoku"} <= set(registered())
    assert isinstance(make("sokoban"), SokobanEnv) and isinstance(make("sudoku", size=9), SudokuEnv)


@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("kwargs", [{}, {"num_boxes": 2}, {"roles": ("plan",)}, {"split": "eval"}])
def test_check_env_sokoban(style, kwargs):
    for seed in (0, 7, 21):
        check_env(SokobanEnv(style=style, **kwargs), seed=seed)


@pytest.mark.parametrize("style", ["compact", "chat"])
@pytest.mark.parametrize("kwargs", [{}, {"size": 9}, {"roles": ("plan",)}, {"split": "eval"}])
def test_check_env_sudoku(style, kwargs):
    for seed in (0, 7, 21):
        check_env(SudokuEnv(style=style, **kwargs), seed=seed)


@pytest.mark.parametrize("env", [SokobanEnv(), SokobanEnv(style="chat"), SudokuEnv(), SudokuEnv(style="chat")])
def test_junk_never_raises(env):
    env.reset(3)
    for text in JUNK_ACTIONS + ["[(0, 1, 9), (7, 7, 1)]", "9999/9999/9999/9999", "(1,1,1)" * 3000]:
        twin = env.clone()
        res = twin.step(text)
        assert res.reward.local <= 0.0 and res.reward.team == 0.0


# ---- solvability, uniqueness ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"num_boxes": 2}])
def test_sokoban_expert_solves(kwargs):
    env = SokobanEnv(**kwargs)
    for seed in range(50):
        env.reset(seed)
        assert not env.success and not env._ends_early()
        env.step(env.expert_action("tool"))
        res = env.step(env.expert_action("plan"))
        assert env.success and res.terminated and res.reward.team == 1.0 and res.info["success"]


@pytest.mark.parametrize("style", ["compact", "chat"])
def test_sudoku_expert_solves(style):
    env = SudokuEnv(style=style)
    for seed in range(50):
        env.reset(seed)
        assert not env.success
        env.step(env.expert_action("tool"))
        assert not env.success  # the tool's answer is only simulated
        res = env.step(env.expert_action("plan"))
        assert env.success and res.terminated and res.reward.team == 1.0


def test_sudoku_chat_plan_expert_copies_a_solving_proposal_and_otherwise_fills():
    env = SudokuEnv(style="chat", size=4, holes=6, tool_mode="code")
    env.reset(3)
    env.step(env.expert_action("tool"))
    shown = env.observe("plan")[-1]["content"]
    answer = env.expert_action("plan")
    assert answer == slash(env.solution, 4).replace("/", "\n") and answer in shown  # copied as the prompt shows it
    env.reset(3)
    env.proposal = (slash(env.board, 4), "C")  # a proposal that does not solve: the fills, as before
    assert env.expert_action("plan").startswith("[(")


def test_sudoku_expert_repairs_wrong_fills():
    env = SudokuEnv(style="chat", roles=("plan",))
    env.reset(5)
    i = env.board.index(0)
    wrong = next(v for v in range(1, 5) if v != env.solution[i])
    env.board[i] = wrong  # a wrong (possibly conflicting) fill left on the board
    env.step(env.expert_action("plan"))
    assert env.success


def test_sudoku_unique_and_givens_match_solution():
    for size, seeds in ((4, range(50)), (9, range(5))):
        env = SudokuEnv(size=size)
        n = size
        for seed in seeds:
            env.reset(seed)
            assert env.board.count(0) == env.holes
            assert count_solutions(list(env.givens), n) == 1
            assert all(g in (0, s) for g, s in zip(env.givens, env.solution))
            assert count_solutions(list(env.solution), n) == 1 and 0 not in env.solution


# ---- splits -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make_env", [lambda split: SokobanEnv(split=split), lambda split: SudokuEnv(split=split)])
def test_train_eval_disjoint(make_env):
    prints = {}
    for split in ("train", "eval"):
        env = make_env(split)
        prints[split] = set()
        for seed in range(300):
            env.reset(seed)
            if isinstance(env, SokobanEnv):
                prints[split].add(env.fingerprint_of((env.room, env.player, env.boxes)))
            else:
                prints[split].add(env.fingerprint_of((env.givens, env.solution)))
        assert len(prints[split]) > 100  # many distinct puzzles
    assert not prints["train"] & prints["eval"]


# ---- rewards by hand --------------------------------------------------------------------------------------
def test_sokoban_push_onto_goal_solves():
    env = SokobanEnv(roles=("plan",))
    env.reset(0)
    _set_sokoban(env, goals=[(2, 3)], player=(2, 1), boxes=[(2, 2)])
    res = env.step("R")
    # -0.01 step, +1 onto goal, +0.1 * (1 - 0) shaping, +10 solve
    assert res.reward.local == pytest.approx(-0.01 + 1.0 + 0.1 + 10.0)
    assert res.reward.team == 1.0 and res.terminated and env.boxes == ((2, 3),) and env.player == (2, 2)


def test_sokoban_invalid_moves_and_stop_at_solve():
    env = SokobanEnv(roles=("plan",))
    env.reset(0)
    _set_sokoban(env, goals=[(2, 3)], player=(1, 1), boxes=[(3, 3)])
    res = env.step("UL")  # both into the border: nothing moves
    assert res.reward.local == pytest.approx(2 * (-0.01 - 0.05)) and res.info["invalid_moves"] == 2
    assert env.player == (1, 1) and res.reward.team == 0.0 and not res.done
    _set_sokoban(env, goals=[(2, 3)], player=(4, 3), boxes=[(3, 3)])
    res = env.step("UUUU")  # the first push solves; the rest is not executed
    assert res.info["moves_used"] == 1 and env.player == (3, 3) and env.success


def test_sokoban_box_off_goal_and_deadlock():
    env = SokobanEnv(roles=("plan",))
    env.reset(0)
    _set_sokoban(env, goals=[(2, 3), (4, 2)], player=(2, 2), boxes=[(2, 3), (3, 2)])
    res = env.step("R")  # box (2,3) off its goal to (2,4): distance sum 0+1 -> 1+1
    assert res.reward.local == pytest.approx(-0.01 - 0.5 - 0.1)
    assert (2, 4) not in env.room.live and res.terminated and not env.success  # dead square ends the episode
    env.reset(0)
    _set_sokoban(env, goals=[(2, 3)], player=(3, 2), boxes=[(2, 2)])
    env.step("U")  # box onto (1,2), against the top wall: it can never be pushed down again
    assert env._ends_early() and env.done


def test_sokoban_tool_is_simulated_and_shown():
    env = SokobanEnv()
    env.reset(0)
    _set_sokoban(env, goals=[(2, 3)], player=(2, 1), boxes=[(2, 2)])
    res = env.step("R")
    assert res.reward.local > 10 and res.reward.team == 0.0 and not res.done
    assert env.boxes == ((2, 2),) and env.player == (2, 1)  # real state untouched
    prompt = env.observe()
    assert env.current_agent == "plan" and "T:R@A2,2 B2,3+" in prompt and prompt.endswith("\n>")
    assert "A2,1" in prompt.splitlines()[0]  # the current position, not the start


def test_sudoku_rewards():
    env = SudokuEnv(roles=("plan",))
    env.reset(2)
    n, sol, giv = env.n, env.solution, env.givens
    empty = [i for i in range(n * n) if not giv[i]]
    i = empty[0]
    res = env.step(f"[({i // n}, {i % n}, {sol[i]})]")  # one correct fill
    assert res.reward.local == pytest.approx(0.1) and env.board[i] == sol[i] and not res.info["parse_error"]
    g = next(j for j in range(n * n) if giv[j])
    bad = next(v for v in range(1, n + 1) if v != giv[g])
    before = list(env.board)
    res = env.step(f"[({g // n}, {g % n}, {bad})]")  # a fill on a given: penalised, not applied
    assert res.reward.local == pytest.approx(-0.2) and env.board == before and res.info["given_fills"] == 1
    j = empty[1]
    r, c = divmod(j, n)
    clash = next(env.board[r * n + k] for k in range(n) if env.board[r * n + k])  # a digit already in row r
    res = env.step(f"[({r}, {c}, {clash})]")
    assert res.reward.local == pytest.approx(-0.1) and env.board == before and res.info["violations"] == 1


def test_sudoku_stall_penalty_scores_no_progress_as_unreadable():
    """The same answers with and without ``stall_penalty``: only those that leave no more cells right (and do not
    solve) change, to FORMAT_PENALTY, and a crash-level score is never raised."""
    for stall in (False, True):
        env = SudokuEnv(roles=("plan",), stall_penalty=stall)
        env.reset(2)
        n, sol, giv = env.n, env.solution, env.givens
        empty = [i for i in range(n * n) if not giv[i]]
        res = env.step(slash(giv, n))  # the board printed back: parses, changes nothing
        assert res.info["stalled"] and res.reward.local == pytest.approx(-1.0 if stall else 0.0)
        i = empty[0]
        res = env.step(f"[({i // n}, {i % n}, {sol[i]})]")  # progress: scored as before
        assert not res.info["stalled"] and res.reward.local == pytest.approx(0.1)
        res = env.step(f"[({i // n}, {i % n}, 0)]")  # erasing it again: a step back
        assert res.info["stalled"] and res.reward.local == pytest.approx(-1.0 if stall else -0.1)
    env = SudokuEnv(stall_penalty=True)
    env.reset(4)
    res = env.step(slash(env.solution, 4))  # the tool's solving proposal keeps its bonus
    assert not res.info["stalled"] and res.reward.local == pytest.approx(0.1 * env.holes + 2.0)


def test_sudoku_grid_ignoring_givens_rejected():
    env = SudokuEnv(roles=("plan",))
    for seed in range(20):
        env.reset(seed)
        perm = {1: 2, 2: 1, 3: 3, 4: 4}
        other = [perm[v] for v in env.solution]  # another valid full grid
        assert count_solutions(other, 4) == 1 and tuple(other) != env.solution
        res = env.step(slash(other, 4))
        assert res.info["rejected"] and res.reward.local == pytest.approx(-0.5) and res.reward.team == 0.0
        assert tuple(env.board) == env.givens and not env.success


def test_sudoku_solve_bonus_and_tool_proposal():
    env = SudokuEnv()
    env.reset(4)
    res = env.step(slash(env.solution, 4))
    assert res.reward.local == pytest.approx(0.1 * env.holes + 2.0) and res.reward.team == 0.0
    assert tuple(env.board) == env.givens  # the tool's grid was only simulated
    assert f"T:{slash(env.solution, 4)} S" in env.observe("plan")


def test_sudoku_parse_forms():
    grid = [1, 2, 3, 4, 3, 4, 1, 2, 2, 1, 4, 3, 4, 3, 2, 1]
    for text in ["1234/3412/2143/4321", "Answer:\n1 2 | 3 4\n3 4 | 1 2\n----+----\n2 1 | 4 3\n4 3 | 2 1",
                 "[[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]", "[\n [1, 2, 3, 4],\n [3, 4, 1, 2],\n [2, 1, 4, 3],\n"
                 " [4, 3, 2, 1]\n]", "(0,0,2) is wrong, so:\n1234\n3412\n2143\n4321"]:
        assert parse_action(text, 4) == ("grid", grid, True), text
    assert parse_action("maybe (0,0,4)? Final: [(0, 1, 3), (2, 2, 4)]", 4) == ("fills", [(0, 1, 3), (2, 2, 4)], True)
    assert parse_action("[[0,1,3],[2,2,4]]", 4) == ("fills", [(0, 1, 3), (2, 2, 4)], True)
    assert parse_action("[(0, 1, 3), (9, 9, 9)]", 4) == ("fills", [(0, 1, 3)], False)
    assert parse_action("no idea", 4) == ("none", [], False)
    assert parse_action("12.4/3412/2143/4321", 4) == ("grid", [1, 2, 0, 4] + grid[4:], True)
    assert parse_action("So the answer is 1234/3412/2143/4321.", 4) == ("grid", grid, True)
    assert parse_action("12345/3412/2143/4321", 4)[0] == "none"


# ---- L0 variant, clones ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", [SokobanEnv(roles=("plan",)), SudokuEnv(roles=("plan",))])
def test_single_agent_variant(env):
    env.reset(1)
    assert env.agents == ("plan",) and env.current_agent == "plan" and "T:" not in env.observe()
    res = env.step(env.expert_action("plan"))
    assert res.reward.team == 1.0 and res.terminated and env.turn == 1


@pytest.mark.parametrize("env", [SokobanEnv(), SudokuEnv(), SudokuEnv(size=9)])
def test_answer_alphabet_covers_compact_expert(env):
    env.reset(2)
    assert set(env.expert_action("plan")) <= set(env.answer_alphabet()) | {"/"}
    assert env.single_agent_roles == ("plan",)


@pytest.mark.parametrize("env", [SokobanEnv(), SudokuEnv()])
def test_clone_independent(env):
    env.reset(6)
    env.step(env.expert_action("tool"))
    snap = env.observe()
    twin = env.clone()
    twin.step(twin.expert_action("plan"))
    assert twin.success and not env.success and env.observe() == snap
    with pytest.raises(ValueError):
        type(env)(roles=("plan", "tool"))


def test_unreadable_answer_scores_below_readable_mistakes():
    """An answer with nothing readable must never be the safe choice: it scores below a rejected Sudoku grid and
    below a Sokoban list of invalid moves (with -0.2, RL drove a warm-started Sudoku policy to emit junk)."""
    sud = SudokuEnv(roles=("plan",))
    sud.reset(3)
    other = [{1: 2, 2: 1, 3: 3, 4: 4}[v] for v in sud.solution]
    rejected = sud.step(slash(other, 4)).reward.local
    sud.reset(3)
    junk = sud.step("no grid here").reward.local
    assert junk < rejected < 0
    sok = SokobanEnv(roles=("plan",))
    sok.reset(0)
    _set_sokoban(sok, goals=[(2, 3)], player=(1, 1), boxes=[(3, 3)])
    invalid = sok.step("ULUL").reward.local  # four moves into the border
    _set_sokoban(sok, goals=[(2, 3)], player=(1, 1), boxes=[(3, 3)])
    assert sok.step("no moves").reward.local < invalid < 0


def test_plan_expert_uses_a_solving_tool_proposal():
    """The scripted planner executes the tool's proposal when its simulation solved the task (a longer, non-BFS
    solution is kept as proposed), and solves by itself otherwise."""
    from atgrpo.envs import PlanPathEnv

    sok = SokobanEnv()
    sok.reset(0)
    _set_sokoban(sok, goals=[(2, 3)], player=(4, 3), boxes=[(3, 3)])
    assert sok.expert_action("plan") == "U"  # no proposal yet: BFS
    sok.step("LRU")  # tool: a detour, then the push that solves (simulated only)
    assert not sok.success and sok.expert_action("plan") == "LRU"
    assert sok.expert_action("tool") == "U"
    sok.step(sok.expert_action("plan"))
    assert sok.success
    sok.reset(0)
    _set_sokoban(sok, goals=[(2, 3)], player=(4, 3), boxes=[(3, 3)])
    sok.step("L")  # a proposal that does not solve: the planner solves by itself
    assert sok.expert_action("plan") == sok.room.solve(sok.player, sok.boxes)

    pp = PlanPathEnv()
    pp.reset(1)
    best = pp.expert_action("tool")
    detour = "UD" + best if pp.simulate(pp.pos, list("UD" + best))[2]["reached"] else best
    pp.step(detour)
    assert pp.expert_action("plan") == detour


def test_plan_path_min_moves_puts_the_goal_that_far_and_leaves_the_default_grids_alone():
    """``min_moves``: every start is at least that many BFS moves from its goal; without it the grids are the ones
    drawn before the option existed (same seed, same grid), so earlier results stay reproducible."""
    from atgrpo.envs import PlanPathEnv
    from atgrpo.envs.plan_path import bfs_path, generate_grid
    import random

    far = PlanPathEnv(size=7, wall_prob=0.3, min_moves=8, split="eval")
    lengths = []
    for seed in range(40):
        far.reset(seed)
        lengths.append(len(bfs_path(far.size, far.walls, far.start, far.goal)))
    assert min(lengths) >= 8
    near = [len(bfs_path(7, *generate_grid(random.Random(s), 7, 0.3))) for s in range(40)]
    assert min(near) < 8  # the option changes something: without it near goals occur
    assert [generate_grid(random.Random(s), 7, 0.3) for s in range(5)] == \
        [generate_grid(random.Random(s), 7, 0.3, min_moves=1) for s in range(5)]
    with pytest.raises(ValueError, match="min_moves"):
        PlanPathEnv(size=5, min_moves=9)
