"""check_env on every registered environment, in both prompt styles and the single-agent variant."""

import pytest

from atgrpo.envs import check_env, make, registered


@pytest.mark.parametrize("name", list(registered()))
@pytest.mark.parametrize("style", ["compact", "chat"])
def test_check_env_every_registered_env(name, style):
    env = make(name, style=style)
    check_env(env, seed=0, episodes=2)
    if env.single_agent_roles:
        check_env(make(name, style=style, roles=env.single_agent_roles), seed=5, episodes=1)


def test_unknown_env_names_the_registered_ones():
    with pytest.raises(ValueError, match="plan_path"):
        make("no_such_env")


def test_plan_path_prompt_shows_current_position_not_start():
    env = make("plan_path", size=5, wall_prob=0.0, max_turns=3)
    env.reset(1)
    start = env.pos
    env.step("")  # tool: no proposal
    expert = env.expert_action("plan")
    env.step(expert[:1])  # plan: one real move
    assert env.pos != start
    prompt = env.observe("tool")
    assert f"A{env.pos[0]},{env.pos[1]}" in prompt and f"A{start[0]},{start[1]}" not in prompt
    chat = env.observe("plan", style="chat")[1]["content"]
    assert f"row {env.pos[0]}, col {env.pos[1]}" in chat


def test_plan_path_rewards_by_hand():
    env = make("plan_path", size=5, wall_prob=0.0, max_turns=3)
    env.reset(0)
    env.walls, env.pos, env.goal = frozenset({(0, 1)}), (0, 0), (0, 2)
    # tool: R into the wall: -0.01 step, -0.1 invalid, no shaping; simulated only
    r = env.step("R")
    assert r.reward.local == pytest.approx(-0.11) and r.reward.team == 0.0 and env.pos == (0, 0)
    # plan: D R R U reaches the goal in 4 moves = BFS-optimal: +1 +0.5 bonus; shaping 0.99*Phi' - Phi per move
    r = env.step("DRRU")
    phis = [-2, -3, -2, -1, 0]
    shaping = sum(0.99 * b - a for a, b in zip(phis, phis[1:]))
    assert r.reward.local == pytest.approx(shaping - 0.04 + 1.5)
    assert r.reward.team == 1.0 and r.terminated and env.success


@pytest.mark.parametrize("name", ["plan_path", "sokoban", "sudoku", "code", "math"])
def test_roles_checked_by_the_base_class(name):
    env = make(name)
    assert env.agents == env.team_roles and len(env.team_roles) == 2
    assert make(name, roles=env.single_agent_roles).agents == env.single_agent_roles
    with pytest.raises(ValueError, match=f"{name} roles must be"):
        make(name, roles=tuple(reversed(env.team_roles)))
