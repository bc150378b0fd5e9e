"""Seconds per decoding step spent drawing the tokens: ``torch.multinomial``, a one-level inverse CDF (one float64
running sum over the vocabulary, atgrpo's sampler before the two levels) and ``causal_lm.sample_tokens`` (two
levels: blocks, then tokens), at one decoding step of a tree rollout (default: 64 rows, SmolLM2's 49,152-token
vocabulary).

    python benchmarks/sample_tokens_cost.py [--rows 64] [--vocab 49152] [--threads 1] [--reps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from atgrpo.engine.sampling import sample_tokens


def seconds(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def one_level(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    cdf = probs.double().cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(args.rows, args.vocab, generator=g), -1)
    multi = seconds(lambda: torch.multinomial(probs, 1, generator=g), args.reps)
    one = seconds(lambda: one_level(probs, g), args.reps)
    two = seconds(lambda: sample_tokens(probs, g), args.reps)
    print(f"{args.rows} rows x {args.vocab} tokens, {args.threads} thread(s): torch.multinomial {multi * 1e3:.1f} ms, "
          f"one-level inverse CDF {one * 1e3:.1f} ms, sample_tokens {two * 1e3:.1f} ms "
          f"({multi / two:.1f}x and {one / two:.1f}x faster)")


if __name__ == "__main__":
    main()
