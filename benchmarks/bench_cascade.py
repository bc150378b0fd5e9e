"""Cascade decoding vs the reserved expanded cache, side by side: ``generate`` at the issue's shape (8 prompts of
200 tokens, K = 8, 16 new tokens, EOS suppressed), the same policy and seed, repetitions interleaved. Checks that
both sample the same tokens, then prints the median seconds of each.

    python benchmarks/bench_cascade.py [--threads 1] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from atgrpo.bench.common import Shape, interleaved, make_policy, prompt_texts, suppress_eos


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = Shape()
    policy = make_policy(shape)
    suppress_eos(policy.model)
    prompts = [policy.encode(t) for t in prompt_texts(shape)]

    def run(cascade: bool):
        def go():
            policy.cascade = cascade
            return policy.generate(prompts, shape.K, 1.0, shape.new_tokens, torch.Generator().manual_seed(0))
        return go

    a, b = run(True)(), run(False)()
    assert [c.ids for r in a for c in r] == [c.ids for r in b for c in r], "the two caches sampled different tokens"
    times = interleaved({"cascade": run(True), "reserved expanded cache": run(False)}, args.reps, 1)
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.3f} s over {len(t)} repetitions")


if __name__ == "__main__":
    main()
