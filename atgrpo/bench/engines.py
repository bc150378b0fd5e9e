"""Rollout engines side by side: ``atgrpo bench rollout --engine native,vllm`` on a real Hugging Face model.

The SmolLM2 shape by default: 8 chat prompts (Plan-Path observations through the model's chat template, padded
with more of the grid description to about 300 tokens), K = 8 samples each, 64 new tokens, temperature 1,
float32 or (``precision="bfloat16"``) bfloat16 on both sides (native: its bfloat16 rollout copy, sampling only,
as a ``model.precision=bfloat16`` run samples; vLLM: ``dtype=bfloat16``), or both side by side, in one process:
every repetition runs each engine once, in rotating order (``interleaved``); EOS is suppressed on both (native:
a -1e4 bias on its logit; vLLM: no stop token, ``ignore_eos``), so each engine produces exactly P * K * T tokens
(checked). Also measured: the vLLM engine's start-up, its full-weight sync
(the trainer's ``state_dict`` written to /dev/shm and reloaded in place, median of ``reps``), and with
``--train-step`` one whole ``atgrpo train`` step with each engine (L1, chat Plan-Path with direct tool answers,
2 problems, K = 8, 64 new tokens, zero-variance groups kept so every step updates; the second of two steps:
rollout, for vLLM the trainer's log-prob recompute, update, for vLLM the weight sync).
"""

from __future__ import annotations

import time

import torch

from .common import (bf16_rollout_view, chat_prompt_texts, hf_policy, interleaved, machine, summarize, suppress_eos,
                     write_report)


def bench_engines(engines: list[str], out_dir: str, name: str, command: str, model_path: str | None = None,
                  preset: str | None = "smollm2-135m", prompts: int = 8, prompt_tokens: int | tuple[int, int] = 300, K: int = 8,
                  new_tokens: int = 64, reps: int = 3, warmup: int = 1, seed: int = 0, vllm_cfg=None,
                  train_step: bool = False, precisions: tuple[str, ...] = ("float32",)) -> dict:
    from ..config import VLLMConfig

    vcfg = vllm_cfg or VLLMConfig()
    longest = max(prompt_tokens) if isinstance(prompt_tokens, tuple) else prompt_tokens
    policy, mcfg = hf_policy(model_path, preset, max(4096, longest + 64))
    policy.model.eval()
    prompt_ids = [policy.encode(t) for t in chat_prompt_texts(policy, prompts, prompt_tokens, seed)]
    P, T, expect = len(prompt_ids), new_tokens, len(prompt_ids) * K * new_tokens
    gen = torch.Generator().manual_seed(seed)
    counts: dict[str, int] = {}
    methods, extra, started = {}, {}, []
    load = _loadavg()

    def label(engine: str, precision: str) -> str:
        return engine + ("_bf16" if precision == "bfloat16" else "")

    try:
        for precision in precisions:
            if "native" in engines:
                methods[label("native", precision)] = _native(policy, precision, prompt_ids, K, T, gen, counts,
                                                              label("native", precision))
            if "vllm" in engines:
                engine, info = _vllm_engine(mcfg, vcfg, precision, seed, max(map(len, prompt_ids)) + T + 8, policy,
                                            reps)
                started.append(engine)
                extra[label("vllm", precision)] = info

                def vllm(engine=engine, key=label("vllm", precision)):
                    seed_ = int(torch.randint(0, 2**30, (1,), generator=gen))
                    out = engine.generate(prompt_ids, K, 1.0, T, [], seed_)
                    counts[key] = sum(len(ids) for row in out for ids, _, _ in row)

                methods[label("vllm", precision)] = vllm
        times = interleaved(methods, reps, warmup)
    finally:
        for engine in started:
            engine.close()
    assert all(c == expect for c in counts.values()), f"unequal token counts {counts}, expected {expect} each"
    res = {m: summarize(times[m], expect) for m in methods}
    for m in res:
        res[m]["precision"] = "bfloat16" if m.endswith("_bf16") else "float32"
    if train_step:
        extra["train_step"] = {label(e, p): _train_step_seconds(e, model_path, preset, vcfg, p)
                               for p in precisions for e in engines}
    result = {"bench": "engines", "shape": {"prompts": P, "prompt_len": [min(map(len, prompt_ids)),
                                                                       max(map(len, prompt_ids))],
                                            "K": K, "new_tokens": T, "reps": reps}, "precisions": list(precisions),
              "machine": {**machine(), "loadavg_1m_at_end": _loadavg()}, "loadavg_1m_at_start": load,
              "methods": res, "engines": {k: v for k, v in extra.items() if k != "train_step"},
              "train_step": extra.get("train_step", {}), "command": command}
    rows = [(m, res[m]["precision"], expect, res[m]["median_s"], res[m]["tokens_per_s"]) for m in methods]
    notes = [f"load average (1 min) at start {load:.2f}, at end {_loadavg():.2f}"]
    if "bfloat16" in precisions and "native" in engines:
        notes.append("native_bf16: the tree sampler on its bfloat16 rollout copy (sampling only: the trainer's "
                     "log-probs are taken in the update)")
    for m in ("native", "vllm"):
        if m in res and f"{m}_bf16" in res:
            notes.append(f"{m}: bfloat16 vs float32 {res[m]['median_s'] / res[m + '_bf16']['median_s']:.2f}x")
    if "native_bf16" in res and "vllm_bf16" in res:
        notes.append(f"bfloat16: native vs vLLM {res['vllm_bf16']['median_s'] / res['native_bf16']['median_s']:.2f}x")
    for key, info in result["engines"].items():
        notes.append(f"{key}: vLLM {info['version']}, engine start-up {info['startup_s']:.1f} s; full-weight "
                     f"sync {info['weight_sync_s']:.2f} s (median of {info['weight_sync_all_s']})")
    for e, s in result["train_step"].items():
        notes.append(f"atgrpo train step with {e}: {s['step_s']:.1f} s (rollout {s['rollout_s']:.1f} "
                     f"s, update {s['update_s']:.1f} s, weight sync {s.get('sync_s', 0.0):.2f} s; {s['config']})")
    write_report(out_dir, name, result, rows, ("engine", "precision", "tokens", "median s", "tokens/s"), notes)
    return result


def _native(policy, precision: str, prompt_ids, K: int, T: int, gen, counts: dict, key: str):
    """The native tree sampler: on the float32 policy, or on its bfloat16 rollout copy (what a
    ``model.precision=bfloat16`` run samples from; sampling only, the trainer's log-probs are the update's)."""
    sampler = bf16_rollout_view(policy).sampler if precision == "bfloat16" else policy

    def native():
        hook = suppress_eos(sampler.model, policy.eos_id)
        try:
            out = sampler.generate(prompt_ids, K, 1.0, T, gen)
        finally:
            hook.remove()
        counts[key] = sum(len(c.ids) for row in out for c in row)

    return native


def _vllm_engine(mcfg, vcfg, precision: str, seed: int, max_len: int, policy, reps: int):
    """A started vLLM engine in ``precision`` with the policy's weights, and its start-up and weight-sync times."""
    from ..policies.hf import resolve_model_dir
    from ..engine.vllm_engine import VLLMEngine

    t = time.perf_counter()
    engine = VLLMEngine(resolve_model_dir(mcfg), vcfg, dtype=precision, seed=seed, max_model_len=max_len,
                        name=f"bench-{precision}")
    info = {"startup_s": time.perf_counter() - t, "version": engine.vllm_version}
    try:
        syncs = [engine.load_weights(policy.model.state_dict()) for _ in range(max(1, reps))]
    except BaseException:
        engine.close()
        raise
    info["weight_sync_s"] = sorted(syncs)[len(syncs) // 2]
    info["weight_sync_all_s"] = [round(x, 3) for x in syncs]
    return engine, info


def _loadavg() -> float:
    import os

    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


STEP_OVERRIDES = ["model.kind=hf", "env.style=chat", "env.name=plan_path", "env.kwargs.tool_mode=direct",
                  "algo.filter_zero_variance=false", "policy.sharing=L1", "rollout.K=8",
                  "rollout.problems_per_step=2", "rollout.max_new_tokens=64", "warmstart.enabled=false",
                  "algo.lr=1e-5", "eval.problems=1", "train.steps=2"]


def _train_step_seconds(engine: str, model_path: str | None, preset: str | None, vcfg, precision: str) -> dict:
    """Seconds of one ``train_step`` (the second of two: the first warms up) with ``rollout.engine=engine``."""
    import dataclasses

    from ..config import load_config
    from ..trainer.state import build_state
    from ..trainer.step import train_step

    src = f"model.path={model_path}" if model_path else f"model.preset={preset}"
    over = STEP_OVERRIDES + [src, f"rollout.engine={engine}", f"model.precision={precision}"]
    over += [f"rollout.vllm.{f.name}={getattr(vcfg, f.name)}" for f in dataclasses.fields(vcfg)
             if getattr(vcfg, f.name) is not None]
    cfg = load_config(None, over)
    state = build_state(cfg)
    if engine == "vllm":
        from ..trainer.vllm_backend import VLLMBackend

        state.backend = VLLMBackend(cfg, state)
    try:
        train_step(state, 1)
        m = train_step(state, 2).metrics()
    finally:
        state.backend.close()
    out = {"step_s": m["time/step"], "rollout_s": m["time/rollout"], "update_s": m["time/update"],
           "config": "L1 chat Plan-Path, 2 problems, K=8, 64 new tokens, 2nd step"}
    if engine == "vllm":
        out["sync_s"] = m["time/weight_sync"]
    if "rollout/logprob_gap/shared/max" in m:
        out["logprob_gap_max"] = m["rollout/logprob_gap/shared/max"]
    return out
