"""Gradient checkpointing with the shared-prefix update (``model.gradient_checkpointing: true``).

Checkpointed layers rerun their forward during the backward pass. The prefix-tree forward switches the model's
attention to the tree's for the duration of the forward only, so without care the recomputation would run plain
causal attention over the packed sequence (torch notices a different graph and raises). ``cascade.
enable_checkpointing`` makes the tree part of each recomputed forward: the gradients must equal the unchecked ones.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from atgrpo.algorithms.losses import policy_loss
from atgrpo.config import load_config
from atgrpo.policies import ByteTokenizer, CausalLMPolicy
from atgrpo.policies.cascade import enable_checkpointing
from atgrpo.policies.precision import apply_autocast
from atgrpo.policies.shared_prefix import shared_prefix_logprobs
from atgrpo.policies.tokenizer import VOCAB_SIZE
from atgrpo.trainer.setup import build_policies


def _model(arch: str):
    torch.manual_seed(0)
    name = {"llama": "Llama", "qwen3": "Qwen3"}[arch]
    cfg = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256)
    return getattr(transformers, f"{name}ForCausalLM")(cfg)


def _batch():
    """Two prompts (11 and 6 tokens) with 3 and 2 responses of unequal lengths."""
    g = torch.Generator().manual_seed(3)
    p = [[1] + torch.randint(3, 259, (n,), generator=g).tolist() for n in (10, 5)]
    prompts = [p[0]] * 3 + [p[1]] * 2
    responses = [torch.randint(3, 259, (n,), generator=g).tolist() for n in (4, 9, 1, 6, 3)]
    return prompts, responses


def _grads(policy: CausalLMPolicy, shared: bool = True):
    policy.model.train()
    policy.model.zero_grad(set_to_none=True)
    prompts, responses = _batch()
    fn = (lambda *a: shared_prefix_logprobs(policy, *a)) if shared else policy.response_logprobs
    logp, mask = fn(prompts, responses, 0.8)
    adv = torch.randn(len(prompts), generator=torch.Generator().manual_seed(4))
    loss, _ = policy_loss(logp, logp.detach() - 0.05 * mask, adv, mask)
    loss.backward()
    return logp.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch, autocast", [("llama", "none"), ("qwen3", "none"), ("llama", "bfloat16")])
def test_checkpointed_shared_prefix_gradients_equal_unchecked(arch, autocast):
    plain = apply_autocast(_model(arch), autocast)
    checked = copy.deepcopy(plain)
    enable_checkpointing(checked)
    ref_lp, ref = _grads(CausalLMPolicy("p", plain, ByteTokenizer()))
    got_lp, got = _grads(CausalLMPolicy("p", checked, ByteTokenizer()))
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-6, rtol=0)
    assert ref.keys() == got.keys() and len(ref) > 10
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-5, msg=f"gradient of {name}")
    if autocast == "none":  # and both equal one forward per sample (the shared-prefix update is exact)
        _, per_sample = _grads(CausalLMPolicy("p", copy.deepcopy(plain), ByteTokenizer()), shared=False)
        for name, g in per_sample.items():
            torch.testing.assert_close(got[name], g, atol=1e-5, rtol=1e-4, msg=f"gradient of {name}")


def test_plain_checkpointing_would_recompute_the_wrong_attention():
    """The reason for ``checkpoint_context``: transformers' own checkpointing recomputes with the model's default
    attention, and torch's checkpoint detects the different graph."""
    model = _model("llama")
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        _grads(CausalLMPolicy("p", model, ByteTokenizer()))


def test_two_pass_scoring_refuses_checkpointing_with_a_clear_error():
    model = _model("llama")
    enable_checkpointing(model)
    policy = CausalLMPolicy("p", model, ByteTokenizer())
    policy.cascade = False  # an architecture without prefix-tree attention: prompts first, responses on a cache
    with pytest.raises(ValueError, match="algo.shared_prefix=false"):
        _grads(policy)
    with torch.no_grad():  # no backward, nothing recomputed: scoring is allowed
        shared_prefix_logprobs(policy, *_batch(), 1.0)


def test_config_turns_checkpointing_on_for_each_policy():
    cfg = load_config(None, ["model.gradient_checkpointing=true", "policy.sharing=L3", "model.tiny.num_layers=2"])
    assert cfg.algo.shared_prefix  # no longer refused together
    for policy in build_policies(cfg, ["tool", "plan"]).values():
        assert policy.model.model.layers[0].gradient_checkpointing
