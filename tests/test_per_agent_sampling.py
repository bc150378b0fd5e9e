"""rollout.per_agent.<role>: each role samples at its own temperature / max_new_tokens / stop strings, and the
loss scores each sample at the temperature it was drawn at (stored and recomputed log-probs agree per role)."""

from __future__ import annotations

import pytest
import torch

from atgrpo.algorithms.losses import policy_loss
from atgrpo.config import AlgoConfig, ConfigError, load_config, max_new_tokens_any
from atgrpo.envs import make
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, Completion, TinyModelConfig, build_tiny_model
from atgrpo.rollout import Sampling, tree_rollout
from atgrpo.rollout.sampling import cut_at_stop
from atgrpo.trainer.update import backward_micro_batch, micro_batches, minibatch_normalizer

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
PER_AGENT = {"tool": {"temperature": 0.6, "max_new_tokens": 3}, "plan": {"temperature": 1.7, "max_new_tokens": 9}}


def _policy(seed=0):
    torch.manual_seed(seed)
    return CausalLMPolicy("shared", build_tiny_model(TINY, seed), ByteTokenizer())


def _rollout(policy, per_agent, shared_prefix=True):
    envs = [make("plan_path", size=5, wall_prob=0.2, max_turns=2) for _ in range(3)]
    for i, e in enumerate(envs):
        e.reset(i)
    gen = torch.Generator().manual_seed(0)
    samples, _ = tree_rollout(envs, {"shared": policy}, {"tool": "shared", "plan": "shared"},
                              Sampling(4, 1.0, 6, 1.0, per_agent=per_agent), gen)
    return samples


def test_each_role_samples_at_its_own_temperature_and_length():
    samples = _rollout(_policy(), PER_AGENT)
    for role, spec in PER_AGENT.items():
        own = [s for s in samples if s.agent == role]
        assert own and all(s.temperature == spec["temperature"] for s in own)
        assert all(len(s.response_ids) <= spec["max_new_tokens"] for s in own)
        assert max(len(s.response_ids) for s in own) == spec["max_new_tokens"]  # an untrained model runs long


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_stored_and_recomputed_logprobs_agree_per_role(shared_prefix):
    policy = _policy()
    samples = _rollout(policy, PER_AGENT)
    algo = AlgoConfig(shared_prefix=shared_prefix)
    for role, spec in PER_AGENT.items():
        own = [s for s in samples if s.agent == role]
        other = PER_AGENT["plan" if role == "tool" else "tool"]["temperature"]
        with torch.no_grad():
            logp, mask = policy.response_logprobs([s.prompt_ids for s in own], [s.response_ids for s in own],
                                                  spec["temperature"])
            wrong, _ = policy.response_logprobs([s.prompt_ids for s in own], [s.response_ids for s in own], other)
        stored = torch.zeros_like(logp)
        for i, s in enumerate(own):
            stored[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
        assert torch.allclose(logp, stored, atol=2e-5), (logp - stored).abs().max()
        assert (wrong - stored).abs().max() > 1e-2  # the check can tell the temperatures apart
    # the update: every micro-batch holds one temperature and scores at it, so the ratio starts at 1 (KL 0)
    for s in samples:
        s.advantage = 1.0
    micros = micro_batches(samples, algo)
    assert all(len({s.temperature for s in m}) == 1 for m in micros)
    assert {m[0].temperature for m in micros} == {0.6, 1.7}
    norm = minibatch_normalizer(samples, algo)
    for m in micros:
        _, stats = backward_micro_batch(policy, m, norm, algo, temperature=1.0)
        assert stats.clipped_tokens == 0.0 and abs(stats.kl_sum) < 1e-6 * max(1, stats.tokens)
    # scored at the run-wide temperature instead (the mistake this guards against), the ratio is off at once
    logp, mask = policy.response_logprobs([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0)
    old = torch.zeros_like(logp)
    for i, s in enumerate(samples):
        old[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
    _, bad = policy_loss(logp.detach(), old, torch.ones(len(samples)), mask, clip_low=0.2, clip_high=0.2,
                         aggregation="token-mean", normalizer=float(mask.sum()))
    off = ((logp.detach() - old).exp() - 1).abs() * mask
    assert float(off.max()) > 0.05  # the ratio is off before any step (at the right temperature: below 1e-5)
    assert abs(bad.kl_sum) > 1e-3 * bad.tokens


def test_stop_strings_cut_the_response_and_keep_its_logprobs():
    tok = ByteTokenizer()
    ids = tok.encode("ab</t>cd</t>")
    c = Completion(ids, [-0.1 * (i + 1) for i in range(len(ids))], tok.decode(ids), False)
    cut = cut_at_stop(c, ("</t>",), tok.decode)
    assert cut.text == "ab</t>" and cut.ids == ids[:6] and cut.logprobs == c.logprobs[:6] and cut.finished
    assert cut_at_stop(c, ("zz",), tok.decode) is c
    assert cut_at_stop(c, ("d<", "b<"), tok.decode).text == "ab<"  # the earliest of several
    assert Sampling(4, 1.0, 12, per_agent={"tester": {"stop": "</t>"}}).for_agent("tester") == (1.0, 12, ("</t>",))
    assert Sampling(4, 0.9, 12, per_agent={"tester": {"stop": "</t>"}}).for_agent("coder") == (0.9, 12, ())
    assert Sampling(4, 0.9, 12, per_agent={"tester": {"temperature": 0.5, "max_new_tokens": 3}}).for_agent(
        "tester") == (0.5, 3, ())


def test_stop_strings_in_a_rollout_with_recomputed_logprobs():
    policy = _policy(3)
    # an untrained byte-level model emits many bytes: stop at any lowercase vowel, and check the cut rows
    samples = _rollout(policy, {"plan": {"stop": list("aeiou"), "max_new_tokens": 24}})
    plan = [s for s in samples if s.agent == "plan"]
    cut = [s for s in plan if any(v in s.response for v in "aeiou")]
    assert cut, "no response held a stop string"
    for s in cut:
        assert s.response[-1] in "aeiou" and not any(v in s.response[:-1] for v in "aeiou") and s.finished
    with torch.no_grad():
        logp, _ = policy.response_logprobs([s.prompt_ids for s in cut], [s.response_ids for s in cut], 1.0)
    for i, s in enumerate(cut):
        assert torch.allclose(logp[i, :len(s.logprobs)], torch.tensor(s.logprobs), atol=2e-5)


def test_config_overrides_and_errors():
    cfg = load_config(None, ["rollout.per_agent.tool.temperature=0.5", "rollout.per_agent.plan.max_new_tokens=30",
                             "rollout.per_agent.plan.stop=[END]"])
    assert cfg.rollout.per_agent == {"tool": {"temperature": 0.5}, "plan": {"max_new_tokens": 30, "stop": ["END"]}}
    assert max_new_tokens_any(cfg) == 30
    for item, message in [
        ("rollout.per_agent.coder.temperature=0.5",
         "'coder' is not an agent of env 'plan_path' here (agents: tool, plan)"),
        ("rollout.per_agent.tool.top_p=0.9", "unknown config key 'rollout.per_agent.tool.top_p'"),
        ("rollout.per_agent.tool.temperature=0", "rollout.per_agent.tool.temperature=0.0 must be a finite number > 0"),
        ("rollout.per_agent.tool.max_new_tokens=0", "rollout.per_agent.tool.max_new_tokens=0 must be an integer >= 1"),
        ("rollout.per_agent.tool.max_new_tokens=2.5", "rollout.per_agent.tool.max_new_tokens=2.5 must be an integer"),
        ("rollout.per_agent.tool.stop=[1]", "rollout.per_agent.tool.stop=[1] must be a non-empty string or a list"),
    ]:
        with pytest.raises(ConfigError, match=__import__("re").escape(message)):
            load_config(None, [item])
    with pytest.raises(ConfigError, match="'tool' is not an agent"):  # L0 runs the plan agent alone
        load_config(None, ["policy.sharing=L0", "rollout.per_agent.tool.temperature=0.5"])


def test_two_step_run_with_per_role_sampling(tmp_path, fast_overrides):
    import json

    from atgrpo.cli import main

    out = tmp_path / "run"
    assert main(["train", *fast_overrides, "warmstart.enabled=false", "policy.sharing=L1",
                 "rollout.per_agent.tool.max_new_tokens=2", "rollout.per_agent.plan.temperature=1.5",
                 "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(x) for x in (out / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert {r["temperature"] for r in rows if r["agent"] == "plan"} == {1.5}
    assert {r["temperature"] for r in rows if r["agent"] == "tool"} == {1.0}
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(m["loss/approx_kl"]) < 0.05 for m in metrics if "loss/approx_kl" in m)
