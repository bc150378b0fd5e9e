"""The native engine's CPU decode-attention kernel alone, at a table cell's shape, its keys and values in the caches
(one layer's, called again and again) and in memory (30 layers' cycled, as a decoding step reads them).

    python benchmarks/attention_kernel.py [--precision float32|bfloat16] [--own 96] [--threads 2]

Shape: 4 prompts x 1,000 tokens, K = 4 branches each (16 rows), SmolLM2-135M's heads (9 query heads over 3
key/value heads of 64). Prints microseconds per call and GFLOP/s (scores and values' sum, 4 FLOPs per query, key
and dimension); medians of repeated runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from atgrpo.engine import kernels

G, HKV, N_REP, D, P, T, K, LAYERS = 4, 3, 3, 64, 1000, 192, 4, 30


def _median(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--own", type=int, default=96, help="own keys per row (the step's position)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if kernels.module() is None:
        raise SystemExit(f"the kernels are not built here: {kernels.available()[1]}")
    dt = getattr(torch, a.precision)
    g = torch.Generator().manual_seed(0)
    A = G * K
    q = torch.randn(A, HKV * N_REP, D, generator=g).to(dt)
    layers = []
    for _ in range(LAYERS):
        pk, pv = (torch.randn(G, HKV, P, D, generator=g).to(dt) for _ in range(2))
        ok, ov = (torch.randn(A, HKV, T, D, generator=g).to(dt) for _ in range(2))
        layers.append((kernels.transpose_keys(pk), kernels.pair_values(pv), ok, ov))
    rows, plen = torch.arange(G).repeat_interleave(K), torch.full((G,), P)

    def call(layer):
        kt, vp, ok, ov = layer
        kernels.decode_attention(q, kt, vp, plen, ok, ov, a.own, rows, D ** -0.5)

    hot = _median(lambda: call(layers[0]), 200)
    cold = _median(lambda: [call(layer) for layer in layers], 15) / LAYERS
    flops = A * HKV * N_REP * (P + a.own) * D * 4
    print(f"# decode_attention, {a.precision}, {A} rows over {G} prompts x {P} keys, {a.own} own keys, "
          f"{a.threads} threads")
    for name, t in (("in the caches", hot), ("in memory (30 layers cycled)", cold)):
        print(f"{name}: {t * 1e6:.0f} us per call, {flops / t / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
