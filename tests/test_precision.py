"""Mixed precision (``model.autocast: bfloat16``): bfloat16 compute on float32 master weights.

The update under autocast must be the float32 update up to bfloat16 rounding, the weights, gradients and
optimizer states must stay float32, the LM head's logits float32, and sampling's log-probs must match scoring's
(the importance ratio starts at 1 up to that rounding). CPU autocast runs bfloat16, so all of it is checked here.
"""

from __future__ import annotations

import copy

import pytest
import torch

from atgrpo.config import AlgoConfig, ConfigError, load_config
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from atgrpo.policies.precision import apply_autocast
from atgrpo.rollout.records import Sample
from atgrpo.trainer.setup import build_policies
from atgrpo.trainer.update import make_optimizer, score, update_policy

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)


def _pair(seed: int = 0) -> tuple[CausalLMPolicy, CausalLMPolicy]:
    """The same tiny model twice: float32 compute, and bfloat16 autocast on float32 weights."""
    model = build_tiny_model(TINY, seed)
    mixed = apply_autocast(copy.deepcopy(model), "bfloat16")
    return CausalLMPolicy("p", model, ByteTokenizer()), CausalLMPolicy("p", mixed, ByteTokenizer())


def _matmul_dtypes(policy: CausalLMPolicy) -> set[torch.dtype]:
    """The output dtypes of the first attention projection in one forward: shows what the matmuls ran in."""
    seen: set[torch.dtype] = set()
    root = getattr(policy.model, "peft", policy.model)  # L2's AdapterView: the shared peft model
    proj = next(m for n, m in root.named_modules() if n.endswith("q_proj"))
    handle = proj.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([policy.encode("abc")])).logits
    handle.remove()
    assert logits.dtype == torch.float32  # the LM head runs in its weights' dtype
    return seen


def _samples(policy: CausalLMPolicy) -> list[Sample]:
    prompts = [policy.encode("plan a path from S to G"), policy.encode("3 + 4 =")]
    comps = policy.generate(prompts, 4, 1.0, 12, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(9)
    return [Sample(problem=str(i), branch=k, turn=0, agent="a", policy="p", prompt="", prompt_ids=prompts[i],
                   response="", response_ids=c.ids, logprobs=c.logprobs, reward_team=0.0, reward_local=0.0,
                   reward=0.0, selected=False, finished=c.finished, advantage=float(torch.randn(1, generator=g)))
            for i, row in enumerate(comps) for k, c in enumerate(row)]


def test_autocast_runs_matmuls_in_bfloat16_and_keeps_logits_float32():
    plain, mixed = _pair()
    assert _matmul_dtypes(plain) == {torch.float32}
    assert _matmul_dtypes(mixed) == {torch.bfloat16}
    with pytest.raises(ValueError, match="already"):
        apply_autocast(mixed.model, "bfloat16")


def test_a_deepcopy_runs_its_own_weights_under_autocast():
    """The KL reference is a deepcopy of the policy: its autocast forward must run the copy, not the original."""
    _, mixed = _pair(4)
    ref = CausalLMPolicy("ref", copy.deepcopy(mixed.model), ByteTokenizer())
    x = torch.tensor([mixed.encode("abc")])
    with torch.no_grad():
        before = ref.model(input_ids=x).logits
        for p in mixed.model.parameters():
            p.add_(0.05)  # the policy trains; the reference must not move
        torch.testing.assert_close(ref.model(input_ids=x).logits, before, atol=0, rtol=0)
        assert not torch.allclose(mixed.model(input_ids=x).logits, before)
    assert _matmul_dtypes(ref) == {torch.bfloat16}


def test_sampled_logprobs_match_scored_logprobs_under_autocast():
    """Cascade decoding (sampling) and the loss's scoring under autocast see the same distribution: the
    importance ratio starts at 1 up to bfloat16 rounding."""
    _, mixed = _pair(1)
    samples = _samples(mixed)
    for shared in (False, True):
        algo = AlgoConfig(shared_prefix=shared)
        with torch.no_grad():
            logp, mask = score(mixed, samples, 1.0, algo)
        for i, s in enumerate(samples):
            torch.testing.assert_close(logp[i, :len(s.response_ids)], torch.tensor(s.logprobs), atol=2e-2, rtol=0)


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_autocast_update_equals_float32_update_within_bfloat16_tolerance(shared_prefix):
    plain, mixed = _pair(2)
    samples = _samples(plain)
    algo = AlgoConfig(shared_prefix=shared_prefix, minibatches=1, micro_batch_size=8, lr=1e-3)
    before = [p.detach().clone() for p in plain.model.parameters()]
    deltas, stats = [], []
    for policy in (plain, mixed):
        opt = torch.optim.SGD(policy.model.parameters(), lr=1.0)  # the step is the gradient: compare it directly
        stats.append(update_policy(policy, opt, samples, algo, 1.0, torch.Generator().manual_seed(0)))
        deltas.append(torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.model.parameters(), before)]))
        assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    ref, got = deltas
    assert ref.norm() > 1e-3  # the update moved the weights
    assert float((got - ref).norm() / ref.norm()) < 0.03  # bfloat16 rounding, not a different update
    assert abs(stats[1].loss - stats[0].loss) < 1e-2


def test_master_weights_and_adamw_states_stay_float32():
    _, mixed = _pair(3)
    samples = _samples(mixed)
    algo = AlgoConfig(minibatches=1, micro_batch_size=8, lr=1e-3)
    opt = make_optimizer(mixed, algo)
    update_policy(mixed, opt, samples, algo, 1.0, torch.Generator().manual_seed(0))
    states = [t for st in opt.state.values() for t in st.values() if t.dim() > 0]
    assert states and all(t.dtype == torch.float32 for t in states)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in mixed.model.parameters())


def test_lora_adapters_train_in_float32_under_autocast():
    """L2: the frozen base and its adapters run under autocast; the adapters (trainable) stay float32."""
    pytest.importorskip("peft")
    cfg = load_config(None, ["policy.sharing=L2", "model.autocast=bfloat16", "model.tiny.hidden_size=64",
                             "model.tiny.num_layers=2", "model.tiny.intermediate_size=128"])
    policies = build_policies(cfg, ["tool", "plan"])
    assert _matmul_dtypes(policies["tool"]) == {torch.bfloat16}
    samples = _samples(policies["tool"])
    algo = AlgoConfig(minibatches=1, micro_batch_size=8, lr=1e-2)
    trainable = {n: p.detach().clone() for n, p in policies["tool"].model.named_parameters() if p.requires_grad}
    assert trainable and all(t.dtype == torch.float32 for t in trainable.values())
    update_policy(policies["tool"], make_optimizer(policies["tool"], algo), samples, algo, 1.0,
                  torch.Generator().manual_seed(0))
    after = dict(policies["tool"].model.named_parameters())
    assert any(float((after[n].detach() - t).abs().max()) > 0 for n, t in trainable.items())


def test_autocast_config_choices():
    assert load_config(None, ["model.autocast=bfloat16"]).model.autocast == "bfloat16"
    with pytest.raises(ConfigError, match="model.autocast"):
        load_config(None, ["model.autocast=float16"])


def test_loss_check_script_compares_autocast_with_float32():
    """benchmarks/loss_check.py (the GPU check's CUDA-vs-CPU comparison) on the CPU with the tiny model."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "loss_check.py"
    main = runpy.run_path(str(script))["main"]
    out = main(["--model", "tiny", "--device", "cpu", "--autocast", "bfloat16", "--prompts", "2", "--K", "2",
                "--new-tokens", "8"])
    assert out["tokens"] > 0 and 0 < out["logprob_abs_diff_max"] < 2e-2
    assert out["grad_rel_diff"] < 0.05 and out["grad_cosine"] > 0.99
    same = main(["--model", "tiny", "--device", "cpu", "--autocast", "none", "--prompts", "2", "--K", "2",
                 "--new-tokens", "8"])
    assert same["logprob_abs_diff_max"] < 1e-5 and same["grad_rel_diff"] < 1e-5
