"""``model.precision``: which precision a run picks on which CPU, and rollouts from a bfloat16 copy of each policy.

The copy must compute what the trainer computes under autocast (its linear weights bfloat16 already; embeddings,
norms and buffers float32; the LM head's highest logits in float32), be refreshed after every update (else the
rollout is off-policy: its log-probs drift from the trainer's, which the gap metric shows), share L2's one base
model between the roles, and hand the loss the trainer's log-probs, not its own.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from atgrpo.bench.rollout import copy_gap
from atgrpo.cli import main
from atgrpo.config import AlgoConfig, ConfigError, ModelConfig, load_config
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from atgrpo.policies.precision import apply_autocast, bf16_units, resolve_precision
from atgrpo.policies.rollout_copy import EXACT_TOP, RolloutCopies
from atgrpo.policies.shared_prefix import shared_prefix_logprobs
from atgrpo.trainer.run_settings import set_precision
from atgrpo.trainer.state import build_state
from atgrpo.trainer.step import train_step

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
AMX_FLAGS = {"fpu", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
ZEN3_FLAGS = {"fpu", "avx2", "fma", "f16c"}  # an AMD EPYC without AVX-512: bfloat16 is emulated


def _mixed(seed: int = 0) -> CausalLMPolicy:
    return CausalLMPolicy("p", apply_autocast(build_tiny_model(TINY, seed), "bfloat16"), ByteTokenizer())


def _prompts(policy) -> list[list[int]]:
    return [policy.encode("plan a path from S to G"), policy.encode("3 + 4 = ")]


def _gap(view, prompts) -> float:
    """The mean log-prob gap of the copy's samples to the trainer's, taken as the update takes it."""
    out = view.generate(prompts, 4, 1.0, 16, torch.Generator().manual_seed(0))
    return copy_gap(view.policy, prompts, out, AlgoConfig())["rollout/logprob_gap/p/mean"]


# ---- which precision ----------------------------------------------------------------------------------------
def test_bf16_units_read_from_the_flags():
    assert bf16_units(AMX_FLAGS) == ["amx_bf16", "avx512_bf16"]
    assert bf16_units(ZEN3_FLAGS) == []
    assert bf16_units({"fp", "asimd", "bf16"}) == ["bf16"]  # aarch64 (Graviton 3, Neoverse V1)


@pytest.mark.parametrize("flags, kind, backend, want", [
    (AMX_FLAGS, "hf", "local", "bfloat16"),
    (ZEN3_FLAGS, "hf", "local", "float32"),
    (AMX_FLAGS, "tiny", "local", "float32"),  # the quickstart keeps its numbers
    (AMX_FLAGS, "hf", "ray", "float32"),  # Ray's rollout workers would run autocast, not a copy: asked for, not auto
])
def test_auto_precision_by_cpu_model_and_backend(flags, kind, backend, want):
    precision, why = resolve_precision(ModelConfig(kind=kind), backend, flags)
    assert precision == want and why


def test_explicit_precision_and_its_contradictions():
    assert resolve_precision(ModelConfig(kind="hf", precision="float32"), "local", AMX_FLAGS)[0] == "float32"
    assert resolve_precision(ModelConfig(kind="hf", precision="bfloat16"), "local", ZEN3_FLAGS)[0] == "bfloat16"
    assert resolve_precision(ModelConfig(autocast="bfloat16"), "local", ZEN3_FLAGS)[0] == "bfloat16"
    assert resolve_precision(ModelConfig(dtype="bfloat16"), "local", ZEN3_FLAGS)[0] == "bfloat16"
    with pytest.raises(ConfigError, match="model.precision=float32 contradicts model.autocast"):
        load_config(None, ["model.precision=float32", "model.autocast=bfloat16"])
    with pytest.raises(ConfigError, match="needs float32 master weights"):
        load_config(None, ["model.precision=float32", "model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="model.precision"):
        load_config(None, ["model.precision=float16"])


def test_auto_is_resolved_and_recorded_at_start_up(monkeypatch):
    """The run's config (config.yaml) records the machine's choice, so a resume elsewhere keeps it."""
    import atgrpo.hardware as precision  # where the choice is made

    lines: list[str] = []
    cfg = load_config(None, ["model.kind=hf", "model.preset=smollm2-135m", "env.style=chat"])
    assert cfg.model.precision == "auto"
    monkeypatch.setattr(precision, "cpu_flags", lambda: set(AMX_FLAGS))
    assert set_precision(cfg, lines.append).model.precision == "bfloat16"
    assert "precision=bfloat16" in lines[-1] and "amx_bf16" in lines[-1] and "model.precision=float32" in lines[-1]
    monkeypatch.setattr(precision, "cpu_flags", lambda: set(ZEN3_FLAGS))
    assert set_precision(cfg, lines.append).model.precision == "float32"
    assert cfg.model.precision == "auto"  # the caller's config is not changed


# ---- the copy ------------------------------------------------------------------------------------------------
def _assert_head_logits(copy_logits, trainer_logits):
    """The copy's logits against the trainer's float32 head: each row's highest equal to float32 rounding (half
    of ``EXACT_TOP``: at the boundary the bfloat16 ranking may differ), the rest within bfloat16 rounding, the same
    argmax."""
    k = min(EXACT_TOP, copy_logits.shape[-1]) // 2
    top = copy_logits.topk(k, dim=-1).indices
    torch.testing.assert_close(copy_logits.gather(-1, top), trainer_logits.gather(-1, top), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(copy_logits, trainer_logits, rtol=2 ** -7, atol=2 ** -7)
    assert torch.equal(copy_logits.argmax(-1), trainer_logits.argmax(-1))


def _linear_names(model) -> set[str]:
    head = model.get_output_embeddings()
    return {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head}


def test_copy_holds_linear_weights_in_bfloat16_the_rest_float32_and_leaves_the_trainer_alone():
    trainer = _mixed()
    view = RolloutCopies({"p": trainer}).views["p"]
    copy_model = view.sampler.model
    linear = _linear_names(copy_model)
    assert linear
    for name, p in copy_model.named_parameters():  # embeddings, norms and the LM head stay float32, as in autocast
        assert p.dtype == (torch.bfloat16 if name in linear else torch.float32), name
        assert not p.requires_grad
    head = copy_model.get_output_embeddings()
    assert torch.equal(head.atgrpo_weight_lp, head.weight.to(torch.bfloat16))  # its ranking copy
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert not any(p.data_ptr() == q.data_ptr() for p in copy_model.parameters() for q in trainer.model.parameters())
    x = torch.tensor([trainer.encode("abc")])
    with torch.no_grad():  # the copy computes what the trainer computes under autocast, up to the head's tail
        _assert_head_logits(copy_model(input_ids=x).logits, trainer.model(input_ids=x).logits)
    with pytest.raises(ValueError, match="autocast"):
        RolloutCopies({"p": CausalLMPolicy("p", build_tiny_model(TINY, 0), ByteTokenizer())})


def test_copy_of_a_hugging_face_llama_computes_the_trainers_logits(tmp_path):
    from hf_dirs import write_tiny_hf_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = write_tiny_hf_dir(str(tmp_path))
    model = apply_autocast(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), "bfloat16")
    trainer = CausalLMPolicy("p", model, AutoTokenizer.from_pretrained(d))
    copies = RolloutCopies({"p": trainer})
    sampler = copies.views["p"].sampler.model
    assert {b.dtype for n, b in sampler.named_buffers() if "inv_freq" in n} == {torch.float32}
    assert sampler.get_output_embeddings().weight is sampler.get_input_embeddings().weight  # still tied
    assert sampler.get_output_embeddings().weight.dtype == torch.float32
    x = torch.tensor([trainer.encode("plan a path")])
    with torch.no_grad():
        _assert_head_logits(sampler(input_ids=x).logits, model(input_ids=x).logits)
    assert _gap(copies.views["p"], _prompts(trainer)) < 0.02


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_loss_gets_the_trainers_logprobs_from_before_the_update_not_the_copys(minibatches):
    """The copy's samples are marked as owed the trainer's log-probs; the update puts in the trainer's, scored
    before its first optimizer step (the first mini-batch in its own forward, later ones in a no-grad pass), and
    logs how far the copy's were. A large learning rate makes scoring after a step visibly different."""
    import copy as copy_module

    from atgrpo.rollout.records import Sample
    from atgrpo.trainer.update import make_optimizer, update_policy

    trainer = _mixed(1)
    copies = RolloutCopies({"p": trainer})
    prompts = [trainer.encode(t) for t in ("plan a path from S to G", "3 + 4 = ", "sort 3 1 2", "hello")]
    rows = copies.views["p"].generate(prompts, 4, 1.0, 12, torch.Generator().manual_seed(5))
    assert all(not c.trainer_logprobs for row in rows for c in row)
    samples = [Sample(problem=f"q{i}", branch=k, turn=0, agent="a", policy="p", prompt="", prompt_ids=p,
                      response="", response_ids=c.ids, logprobs=list(c.logprobs), reward_team=0.0, reward_local=0.0,
                      reward=float(k), selected=k == 0, finished=c.finished, advantage=float(k) - 1.5,
                      temperature=1.0, trainer_logprobs=c.trainer_logprobs)
               for i, (p, row) in enumerate(zip(prompts, rows)) for k, c in enumerate(row)]
    sampled = [list(s.logprobs) for s in samples]
    before = copy_module.deepcopy(trainer)
    with torch.no_grad():
        logp, _ = shared_prefix_logprobs(before, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                         1.0)
    algo = AlgoConfig(minibatches=minibatches, lr=0.05)
    stats = update_policy(trainer, make_optimizer(trainer, algo), samples, algo, 1.0, torch.Generator().manual_seed(0))
    assert stats.optimizer_steps == minibatches
    with torch.no_grad():
        after, _ = shared_prefix_logprobs(trainer, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                          1.0)
    moved = 0.0
    for s, row, row_after, mine in zip(samples, logp, after, sampled):
        n = len(s.response_ids)
        assert s.trainer_logprobs and s.logprobs != mine  # the copy's are gone
        # bfloat16 rounds differently with another packing of the same sequences: 1e-3, not 1e-6
        torch.testing.assert_close(torch.tensor(s.logprobs), row[:n].float(), atol=5e-3, rtol=0)
        moved = max(moved, float((torch.tensor(s.logprobs) - row_after[:n].float()).abs().max()))
    assert moved > 0.1  # scored after a step, they would be far off
    m = stats.logprob_gap
    assert 0 < m["rollout/logprob_gap/p/mean"] <= m["rollout/logprob_gap/p/max"] < 0.05
    assert (stats.rescore_s > 0) == (minibatches > 1)  # the first mini-batch's forward needs no extra pass


def test_greedy_decoding_is_not_rescored():
    copies = RolloutCopies({"p": _mixed(2)})
    rows = copies.views["p"].generate(_prompts(copies.views["p"].policy), 1, 0.0, 8)
    assert all(c.logprobs == [] and c.trainer_logprobs for row in rows for c in row)


def test_the_gap_is_large_without_a_refresh_and_small_after_one():
    trainer = _mixed(3)
    copies = RolloutCopies({"p": trainer})
    view, prompts = copies.views["p"], _prompts(trainer)
    fresh = _gap(view, prompts)
    with torch.no_grad():  # an update moves the trainer's weights
        g = torch.Generator().manual_seed(0)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    stale = _gap(view, prompts)
    head = view.sampler.model.get_output_embeddings()
    assert not torch.equal(head.atgrpo_weight_lp, trainer.model.get_output_embeddings().weight.to(torch.bfloat16))
    copies.refresh(["p"])
    refreshed = _gap(view, prompts)
    assert fresh < 0.02 and refreshed < 0.02
    assert stale > 0.1 and stale > 10 * max(fresh, refreshed)
    copy_params = dict(view.sampler.model.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.equal(copy_params[name], p.detach().to(copy_params[name].dtype))
    assert torch.equal(head.atgrpo_weight_lp, head.weight.to(torch.bfloat16))  # the head's ranking copy re-cast


def test_release_frees_the_trained_weights_and_refresh_makes_them_again():
    trainer = _mixed(4)
    copies = RolloutCopies({"p": trainer})
    view, prompts = copies.views["p"], _prompts(trainer)
    copy_params = dict(view.sampler.model.named_parameters())
    dtypes = {n: q.dtype for n, q in copy_params.items()}
    copies.release(["p"])
    head = view.sampler.model.get_output_embeddings()
    assert all(q.numel() == 0 for q in copy_params.values()) and head.atgrpo_weight_lp.numel() == 0
    with torch.no_grad():  # the update moves the trainer's weights meanwhile
        g = torch.Generator().manual_seed(0)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    copies.refresh(["p"])
    for name, p in trainer.model.named_parameters():  # made again: the new weights, in the copy's own dtypes
        q = copy_params[name]
        assert q.dtype == dtypes[name] and torch.equal(q, p.detach().to(q.dtype))
    assert torch.equal(head.atgrpo_weight_lp, head.weight.to(torch.bfloat16))
    assert _gap(view, prompts) < 0.02


def test_l2_copies_share_one_base_and_refresh_only_the_roles_adapter():
    pytest.importorskip("peft")
    from atgrpo.trainer.setup import build_policies

    cfg = load_config(None, ["policy.sharing=L2", "model.precision=bfloat16", "model.tiny.hidden_size=64",
                             "model.tiny.num_layers=2", "model.tiny.intermediate_size=128"])
    policies = build_policies(cfg, ["plan", "tool"])
    copies = RolloutCopies(policies)
    views = copies.views
    assert views["tool"].sampler.model.peft is views["plan"].sampler.model.peft  # one copy of the base
    assert views["tool"].sampler.model.peft is not policies["tool"].model.peft
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in policies["tool"].model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    shared = dict(views["tool"].sampler.model.peft.named_parameters())
    plan_before = {n: shared[n].clone() for n, _ in policies["plan"].model.named_parameters()}
    base = {n: t for n, t in shared.items() if "lora_" not in n}
    copies.release(["tool"])  # the role's adapter only: the shared base and the other role's adapter stay
    assert all(t.numel() > 0 for t in base.values())
    assert all(shared[n].numel() > 0 for n in plan_before)
    assert all(shared[n].numel() == 0 for n, _ in policies["tool"].model.named_parameters())
    copies.refresh(["tool"])
    for n, p in policies["tool"].model.named_parameters():
        assert "tool" in n and shared[n].dtype == torch.bfloat16  # the adapters' linear layers
        assert torch.equal(shared[n], p.detach().to(torch.bfloat16))
    for n, t in plan_before.items():
        assert torch.equal(shared[n], t)  # the other role's adapter was not touched


# ---- in a run ----------------------------------------------------------------------------------------------
def test_train_steps_sample_from_the_copy_and_refresh_it(fast_overrides):
    state = build_state(load_config(None, fast_overrides + ["model.precision=bfloat16"]))
    assert state.backend.rollout_dtype == torch.bfloat16
    rows = [train_step(state, s).metrics() for s in (1, 2)]
    for m in rows:
        assert 0 <= m["rollout/logprob_gap/shared/mean"] < 0.02, m["rollout/logprob_gap/shared/mean"]
        assert m["rollout/logprob_gap/shared/max"] < 0.1
    trainer, view = state.policies["shared"], state.backend.copies.views["shared"]
    copy_params = dict(view.sampler.model.named_parameters())
    for name, p in trainer.model.named_parameters():  # the copy holds the updated weights
        assert torch.equal(copy_params[name], p.detach().to(copy_params[name].dtype))
    plain = build_state(load_config(None, fast_overrides))
    assert plain.backend.rollout_dtype is None and "rollout/logprob_gap/shared/mean" not in train_step(
        plain, 1).metrics()


def test_resume_keeps_the_runs_precision(tmp_path, fast_overrides):
    out = tmp_path / "run"
    assert main(["train", *fast_overrides, "model.precision=bfloat16", "train.steps=1", "--out", str(out),
                 "--quiet"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["precision"] == "bfloat16"
    assert main(["train", "--resume", str(out), "train.steps=2", "--quiet"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["precision"] == "bfloat16"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/logprob_gap/shared/mean" in r] == [1, 2]
    auto = tmp_path / "auto"
    assert main(["train", *fast_overrides, "train.steps=0", "--out", str(auto), "--quiet"]) == 0
    assert yaml.safe_load((auto / "config.yaml").read_text())["model"]["precision"] == "float32"


def test_copy_gap_script_shows_what_each_bfloat16_part_costs(tmp_path):
    """benchmarks/copy_gap.py on a tiny Llama: the rollout copy with a float32 head scores exactly as the trainer
    does; the copy's own (top-k exact) head is close; a copy with every parameter in bfloat16 is not exact."""
    import runpy
    from pathlib import Path

    from hf_dirs import write_tiny_hf_dir

    d = write_tiny_hf_dir(str(tmp_path))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "copy_gap.py"
    out = runpy.run_path(str(script))["main"](["--model", d, "--prompt-tokens", "40", "--new-tokens", "6"])
    assert out["response_tokens"] > 0
    assert out["f32_head"]["mean"] == 0.0 and out["f32_head"]["max"] == 0.0
    assert out["rollout_copy"]["mean"] < 0.01 and out["bf16_head"]["max"] > 0 and out["all_bf16"]["max"] > 0
