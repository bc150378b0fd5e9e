"""Milliseconds for one decoding step's layer matmuls of SmolLM2-135M's shapes, streamed from memory: plain
``F.linear`` against weights prepacked for oneDNN (``engine/weights.py``), float32 and bfloat16, and the LM head.

    python benchmarks/packed_linear_cost.py [--rows 16,64] [--threads 2]

30 distinct gate/up (3072 x 576) and 30 down (576 x 1536) weights, so every call reads its weight from memory as
a decoding step does (one weight timed over and over stays in cache and flatters the plain call); the head
(49152 x 576) once. Best of 3 passes after one warm-up; the machine's other load shows, so compare columns of
one run.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _seconds(fns, passes: int = 3) -> float:
    for f in fns:
        f()
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        for f in fns:
            f()
        best = min(best, time.perf_counter() - t)
    return best


def _calls(weights, rows: int, packed: bool):
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    if not packed:
        return [lambda w=w: F.linear(xs[w.shape[1]], w) for w in weights]
    ps = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    return [lambda w=w, p=p: torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
            for w, p in zip(weights, ps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,64")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print("| rows | dtype | layers plain ms | layers packed ms | head plain ms | head packed ms |\n|---|---|---|---|---|---|")
    for rows in (int(r) for r in a.rows.split(",")):
        for dtype in (torch.float32, torch.bfloat16):
            layers = ([torch.randn(3072, 576, dtype=dtype) for _ in range(30)]
                      + [torch.randn(576, 1536, dtype=dtype) for _ in range(30)])
            head = [torch.randn(49152, 576, dtype=dtype)]
            ms = [1e3 * _seconds(_calls(w, rows, packed)) for w in (layers, head) for packed in (False, True)]
            print(f"| {rows} | {str(dtype).removeprefix('torch.')} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} | "
                  f"{ms[3]:.1f} |")


if __name__ == "__main__":
    main()
