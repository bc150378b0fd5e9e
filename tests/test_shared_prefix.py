"""Shared-prefix scoring (atgrpo/policies/shared_prefix.py) equals one forward per sample.

Loop-vs-vectorized equivalence: log-probs, masks, the PPO loss and every parameter gradient agree with
``CausalLMPolicy.response_logprobs`` (float32, atol 1e-5) for groups of K = 1 and K = 8, prompts of several
lengths, responses of different lengths, samples in shuffled order, token-mean and seq-mean; the micro-batch
planner keeps groups whole within a token budget; ``update_policy`` takes the same step either way.
"""

from __future__ import annotations

import copy

import pytest
import torch

from atgrpo.algorithms.losses import policy_loss
from atgrpo.config import AlgoConfig, ConfigError, load_config
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from atgrpo.policies.shared_prefix import chunk_cost, group_by_prompt, plan_chunks, shared_prefix_logprobs
from atgrpo.policies.tokenizer import VOCAB_SIZE
from atgrpo.rollout.records import Sample
from atgrpo.trainer.update import split_minibatches, update_policy

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
ATOL = 1e-5


def _policy(seed: int = 0) -> CausalLMPolicy:
    return CausalLMPolicy("p", build_tiny_model(TINY, seed), ByteTokenizer())


def _batch(prompt_lens, K, seed=0, max_resp=12, shuffle=True):
    """K responses of random lengths 1..max_resp to each prompt; samples shuffled so groups interleave."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for lp in prompt_lens:
        p = [1] + torch.randint(3, 259, (lp - 1,), generator=g).tolist()
        for _ in range(K):
            n = int(torch.randint(1, max_resp + 1, (1,), generator=g))
            prompts.append(p)
            responses.append(torch.randint(2, 259, (n,), generator=g).tolist())
    order = torch.randperm(len(prompts), generator=g).tolist() if shuffle else list(range(len(prompts)))
    return [prompts[i] for i in order], [responses[i] for i in order]


def _loss_and_grads(policy, prompts, responses, shared: bool, aggregation: str):
    policy.model.zero_grad(set_to_none=True)
    fn = (lambda *a: shared_prefix_logprobs(policy, *a)) if shared else policy.response_logprobs
    logp, mask = fn(prompts, responses, 0.7)
    g = torch.Generator().manual_seed(5)
    old = (logp.detach() + 0.05 * torch.randn(logp.shape, generator=g)) * mask  # ratios != 1: some clipping
    adv = torch.randn(len(prompts), generator=g)
    loss, stats = policy_loss(logp, old, adv, mask, aggregation=aggregation)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), mask, loss.detach(), grads, stats


@pytest.mark.parametrize("K", [1, 8])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_logp_loss_and_gradients_equal_per_sample(K, aggregation):
    policy = _policy()
    prompts, responses = _batch([7, 31, 18, 2], K, seed=K)
    assert len({len(r) for r in responses}) > 1 or K == 1
    ref = _loss_and_grads(policy, prompts, responses, False, aggregation)
    got = _loss_and_grads(policy, prompts, responses, True, aggregation)
    assert got[0].shape == ref[0].shape and torch.equal(got[1], ref[1])
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[2], ref[2], atol=ATOL, rtol=0)
    assert got[4].tokens == ref[4].tokens and got[4].clipped_tokens == pytest.approx(ref[4].clipped_tokens)
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=ATOL, rtol=1e-4, msg=f"gradient of {name}")
    assert any(g.abs().max() > 0 for g in got[3].values())


@pytest.mark.parametrize("cascade", [True, False])
def test_groups_of_unequal_sizes_with_and_without_cascade(cascade):
    """Groups of 3, 1 and 5 responses (the regrouping path of cascade attention, not its equal-size view), and
    the expanded-cache path used on architectures without cascade attention."""
    policy = _policy(2)
    policy.cascade = cascade
    prompts, responses = [], []
    for lp, K, seed in ((11, 3, 0), (4, 1, 1), (23, 5, 2)):
        p, r = _batch([lp], K, seed=seed, shuffle=False)
        prompts, responses = prompts + p, responses + r
    ref = _loss_and_grads(policy, prompts, responses, False, "token-mean")
    got = _loss_and_grads(policy, prompts, responses, True, "token-mean")
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[2], ref[2], atol=ATOL, rtol=0)
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=ATOL, rtol=1e-4, msg=f"gradient of {name}")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_cascade_architectures_with_grouped_query_attention(arch):
    """Every architecture cascade attention is switched on for (Llama, Qwen2 with its q/k/v biases, Qwen3 with its
    q/k norms), with fewer key/value heads than query heads (SmolLM2, Qwen3): the prefix-tree forward with
    gradients (plain ops) and without (torch's fused CPU kernel) equals one forward per sample."""
    import transformers

    torch.manual_seed(0)
    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[arch]
    cfg = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256)
    policy = CausalLMPolicy("p", getattr(transformers, f"{name}ForCausalLM")(cfg), ByteTokenizer())
    assert policy.cascade
    prompts, responses = _batch([13, 6], 4, seed=4)
    ref = _loss_and_grads(policy, prompts, responses, False, "token-mean")
    got = _loss_and_grads(policy, prompts, responses, True, "token-mean")
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=ATOL, rtol=1e-4, msg=f"gradient of {name}")
    with torch.no_grad():
        frozen, _ = shared_prefix_logprobs(policy, prompts, responses, 0.7)
    torch.testing.assert_close(frozen, ref[0], atol=ATOL, rtol=0)


def test_single_token_responses_and_one_group():
    policy = _policy(1)
    prompts, responses = _batch([9], 8, max_resp=1)
    assert all(len(r) == 1 for r in responses)
    ref = _loss_and_grads(policy, prompts, responses, False, "token-mean")
    got = _loss_and_grads(policy, prompts, responses, True, "token-mean")
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=ATOL, rtol=1e-4)


def test_output_rows_follow_input_order():
    policy = _policy()
    prompts, responses = _batch([5, 12], 3, seed=3)
    with torch.no_grad():
        full, _ = shared_prefix_logprobs(policy, prompts, responses, 1.0)
        for i in (0, 4, len(prompts) - 1):
            one, _ = policy.response_logprobs([prompts[i]], [responses[i]], 1.0)
            torch.testing.assert_close(full[i, :len(responses[i])], one[0], atol=ATOL, rtol=0)


def test_group_by_prompt_and_plan_chunks():
    prompts = [[1, 2], [1, 2, 3], [1, 2], [4], [1, 2, 3], [1, 2]]
    assert group_by_prompt(prompts) == [[0, 2, 5], [1, 4], [3]]
    responses = [[5] * n for n in (3, 4, 5, 6, 7, 8)]
    for budget, max_rows in ((10**6, None), (12, None), (1, None), (10**6, 2)):
        chunks = plan_chunks(prompts, responses, budget, max_rows)
        assert sorted(i for c in chunks for i in c) == list(range(6)), (budget, chunks)
        if max_rows:
            assert all(len(c) <= max_rows for c in chunks)
    assert len(plan_chunks(prompts, responses, 10**6)) == 1  # everything fits: one pass
    # a budget that fits one group at a time keeps each group whole and within budget
    chunks = plan_chunks(prompts, responses, 30)
    for c in chunks:
        groups = group_by_prompt([prompts[i] for i in c])
        cost = chunk_cost([len(prompts[c[g[0]]]) for g in groups], [[len(responses[c[i]]) for i in g] for g in groups])
        assert cost <= 30 or len(groups) == 1
    assert sorted(tuple(sorted(c)) for c in chunks) == [(0, 2, 5), (1, 4), (3,)]
    # a group over the budget on its own is split into sub-groups (each reruns the prompt: still exact)
    assert sorted(tuple(sorted(c)) for c in plan_chunks(prompts, responses, 20)) == [(0, 2, 3), (1, 4), (5,)]


def _samples(prompts, responses, policy):
    g = torch.Generator().manual_seed(9)
    out = []
    with torch.no_grad():
        old, _ = policy.response_logprobs(prompts, responses, 1.0)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        out.append(Sample(problem=str(p[:3]), branch=i, turn=0, agent="a", policy="p", prompt="", prompt_ids=p,
                          response="", response_ids=r, logprobs=old[i, :len(r)].tolist(), reward_team=0.0,
                          reward_local=0.0, reward=0.0, selected=False, finished=True,
                          advantage=float(torch.randn(1, generator=g))))
    return out


@pytest.mark.parametrize("budget", [16384, 40])
def test_update_policy_same_step_either_way(budget):
    base = _policy(2)
    prompts, responses = _batch([11, 25, 6], 4, seed=7)
    samples = _samples(prompts, responses, base)
    params = {}
    for shared in (False, True):
        policy = copy.deepcopy(base)
        algo = AlgoConfig(shared_prefix=shared, update_token_budget=budget, minibatches=2, micro_batch_size=5)
        opt = torch.optim.SGD(policy.model.parameters(), lr=0.5)
        stats = update_policy(policy, opt, samples, algo, 1.0, torch.Generator().manual_seed(0))
        assert stats.optimizer_steps == 2 and stats.tokens == sum(len(r) for r in responses)
        params[shared] = [p.detach().clone() for p in policy.model.parameters()]
    moved = max(float((a - b.detach()).abs().max()) for a, b in zip(params[True], base.model.parameters()))
    assert moved > 1e-4
    for a, b in zip(params[False], params[True]):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


def test_update_reports_the_distance_to_the_reference():
    """With a KL penalty the update reports the penalty's mean per-token estimate: zero while the policy is its
    reference (the first mini-batch), positive once an optimizer step has moved it; None without a penalty."""
    base = _policy(2)
    prompts, responses = _batch([11, 25, 6], 4, seed=7)
    samples = _samples(prompts, responses, base)
    got = {}
    for minibatches, kl_coef in ((1, 0.1), (2, 0.1), (2, 0.0)):
        policy = copy.deepcopy(base)
        algo = AlgoConfig(minibatches=minibatches, kl_coef=kl_coef, micro_batch_size=16)
        opt = torch.optim.SGD(policy.model.parameters(), lr=0.5)
        got[minibatches, kl_coef] = update_policy(policy, opt, samples, algo, 1.0, torch.Generator().manual_seed(0),
                                                  reference=copy.deepcopy(base)).ref_kl
    assert got[1, 0.1] == pytest.approx(0.0, abs=1e-6)
    assert got[2, 0.1] > 1e-5
    assert got[2, 0.0] is None


def test_minibatches_keep_prompt_groups_whole():
    """Each prompt's K responses land in one mini-batch (one prompt pass per step), every sample exactly once,
    mini-batch sizes balanced, the split a function of the generator."""
    pol = _policy(0)
    prompts, responses = _batch([9, 14, 5, 20, 7], 4, seed=3)
    samples = _samples(prompts, responses, pol)
    mbs = split_minibatches(samples, 2, torch.Generator().manual_seed(1))
    assert len(mbs) == 2 and sorted(len(mb) for mb in mbs) == [8, 12]
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in samples)
    for mb in mbs:
        for s in mb:
            assert all(any(o is t for t in mb) for o in samples if o.prompt_ids == s.prompt_ids)
    again = split_minibatches(samples, 2, torch.Generator().manual_seed(1))
    assert [[id(s) for s in mb] for mb in again] == [[id(s) for s in mb] for mb in mbs]
    orders = {tuple(s.branch for s in split_minibatches(samples, 2, torch.Generator().manual_seed(k))[0])
              for k in range(8)}
    assert len(orders) > 1  # the generator decides which groups share a mini-batch
    one_group = [s for s in samples if s.prompt_ids == samples[0].prompt_ids]
    assert len(split_minibatches(one_group, 2, torch.Generator())) == 1  # one group: one mini-batch


def test_config_fields():
    cfg = load_config(None, [])
    assert cfg.algo.shared_prefix is True and cfg.algo.update_token_budget > 0
    assert load_config(None, ["algo.shared_prefix=false"]).algo.shared_prefix is False
    with pytest.raises(ConfigError, match="algo.update_token_budget"):
        load_config(None, ["algo.update_token_budget=0"])
    with pytest.raises(ConfigError, match="algo.shared_prefix"):
        load_config(None, ["algo.shared_prefix=maybe"])


def test_lora_wrapped_model_equal():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(build_tiny_model(TINY, 4), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False))
    policy = CausalLMPolicy("p", model, ByteTokenizer())
    prompts, responses = _batch([6, 19], 4, seed=11)
    ref = _loss_and_grads(policy, prompts, responses, False, "token-mean")
    got = _loss_and_grads(policy, prompts, responses, True, "token-mean")
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)
    assert ref[3] and all("lora" in n for n in ref[3])  # only the adapters train
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=ATOL, rtol=1e-4, msg=f"gradient of {name}")
