"""The warm start of real models (``model.kind=hf``): demonstrations tokenised as rollouts emit them, micro-batched
gradients, and the loss falling for one shared model (L1) and for each role's adapter (L2)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="L2 (per-role LoRA) needs peft: pip install peft")

from atgrpo.config import load_config  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from hf_dirs import changed_params, hf_overrides, snapshot, write_tiny_hf_dir  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_tiny_hf_dir(str(tmp_path_factory.mktemp("hf_model")))


@pytest.fixture(scope="module")
def hf_bos_dir(tmp_path_factory):
    return write_tiny_hf_dir(str(tmp_path_factory.mktemp("hf_bos_model")), add_bos=True)


def test_warmstart_answers_are_tokenised_as_rollouts_without_bos(hf_bos_dir):
    """A tokenizer that prepends BOS to every string must not put one into a demonstration's answer: the
    answer is the tokens a rollout would sample after the same rendered prompt, then EOS."""
    from atgrpo.trainer.warmstart import WARMSTART_SEED_OFFSET, collect_demonstrations

    cfg = load_config(overrides=hf_overrides(hf_bos_dir, "env.name=math", "warmstart.episodes=3", "warmstart.noise=0"))
    st = build_state(cfg)
    pol = st.policies["shared"]
    assert pol.tokenizer("12")["input_ids"][0] == pol.tokenizer.bos_token_id  # the tokenizer does add BOS
    demos = collect_demonstrations(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed)["shared"]
    assert len(demos) >= 6  # 3 episodes, tool and reasoner each act at least once
    for prompt_ids, answer_ids in demos:
        assert pol.tokenizer.bos_token_id not in answer_ids
        assert answer_ids[-1] == pol.eos_id and answer_ids.count(pol.eos_id) == 1
        text = pol.tokenizer.decode(answer_ids[:-1])
        assert answer_ids[:-1] == pol.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert pol.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n<think></think>")
    # the first demonstration's prompt is, token for token, the prompt a rollout of that problem starts with
    env = st.make_env("train", WARMSTART_SEED_OFFSET + cfg.seed * 1_000_000)
    assert demos[0][0] == pol.encode(pol.render(env.observe()))


def test_warmstart_micro_batches_give_the_one_pass_gradient(hf_dir):
    """Splitting a warm-start batch under a small token budget accumulates the same gradient as one pass."""
    from atgrpo.trainer.warmstart import batch_cross_entropy

    pol = build_state(load_config(overrides=hf_overrides(hf_dir))).policies["shared"]
    batch = [(pol.encode(pol.render([{"role": "user", "content": f"question {i} " * (i + 1)}])),
              pol.encode_response(f"answer {i}")) for i in range(6)]
    grads, losses = [], []
    for budget in (100_000, 40):
        pol.model.zero_grad(set_to_none=True)
        losses.append(batch_cross_entropy(pol, batch, budget))
        grads.append([p.grad.clone() for p in pol.model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("sharing", ["L1", "L2"])
def test_warmstart_of_a_hf_model_lowers_its_loss_and_l2_trains_each_adapter_on_its_role(hf_dir, sharing):
    """The warm start runs on a Hugging Face model (chat prompts): the loss falls; with L2 each role's adapter
    learns from its own role's demonstrations and the base stays frozen."""
    from atgrpo.trainer.warmstart import collect_demonstrations, warm_start

    cfg = load_config(overrides=hf_overrides(hf_dir, "env.name=math", f"policy.sharing={sharing}",
                                             "warmstart.episodes=12", "warmstart.epochs=8", "warmstart.batch_size=4",
                                             "warmstart.lr=3e-2", "warmstart.noise=0", "warmstart.common=false"))
    st = build_state(cfg)
    model = st.policies[sorted(st.policies)[0]].model
    model = model.peft if sharing == "L2" else model
    before = snapshot(model)
    if sharing == "L2":
        demos = collect_demonstrations(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed)
        for role, pairs in demos.items():  # each adapter's demonstrations are its own role's prompts
            pol = st.policies[role]
            assert pairs and all(f"You are the {'tool' if role == 'tool' else 'reasoning'} agent"
                                 in pol.tokenizer.decode(p) for p, _ in pairs)
    losses = warm_start(st.make_env, st.agent_to_policy, st.policies, cfg.warmstart, cfg.seed, progress=False)
    assert set(losses) == set(st.policies)
    for pid, curve in losses.items():
        assert len(curve) == 8 and curve[-1] < curve[0] - 0.15, (pid, curve)  # from ~ln(vocab) = 5.6 nats
    changed = changed_params(before, model)
    if sharing == "L2":
        assert changed and all("lora_" in n for n in changed)
        assert any(".tool." in n for n in changed) and any(".reasoner." in n for n in changed)
    else:
        assert len(changed) == len(before)
