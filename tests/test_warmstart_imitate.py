"""``warmstart.imitate``: a demonstration trains on the answer played (``noisy``, the default) or on the expert's
answer in the same state (``expert``) while the episode goes on with the noisy one."""

from __future__ import annotations

from atgrpo.config import load_config
from atgrpo.trainer.state import build_state
from atgrpo.trainer.warmstart import collect_demonstrations

CODE = ["env.name=code", "env.kwargs={dataset: generated, max_turns: 2, timeout: 2.0}", "model.tiny.num_layers=1",
        "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
        "warmstart.episodes=4", "warmstart.noise=1.0"]


def demonstrations(imitate: str) -> tuple[list[tuple[list[int], list[int]]], set[tuple[int, ...]]]:
    """The shared policy's (prompt, answer) pairs, and the encoded expert answers of every episode's problem."""
    cfg = load_config(None, CODE + [f"warmstart.imitate={imitate}"])
    st = build_state(cfg)
    envs = []

    def make_env(split, seed):
        envs.append(st.make_env(split, seed))
        return envs[-1]

    (pairs,) = collect_demonstrations(make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed).values()
    policy = next(iter(st.policies.values()))
    experts = {tuple(policy.encode_response(env.expert_action(agent))) for env in envs for agent in env.agents}
    return pairs, experts


def test_expert_targets_train_on_the_experts_answers_in_the_noisy_episodes():
    noisy, experts = demonstrations("noisy")
    expert, same_experts = demonstrations("expert")
    assert experts == same_experts  # the same problems
    # at noise 1.0 the tester's cases are wrong too, so episodes go on to a second turn (the experts' answers,
    # played, would agree in the first and end every episode after 2 pairs)
    assert len(noisy) == len(expert) > 4 * 2
    assert [p for p, _ in noisy] == [p for p, _ in expert]  # the same states: the episodes played the noisy answers
    assert not any(tuple(a) in experts for _, a in noisy)
    assert all(tuple(a) in experts for _, a in expert)
