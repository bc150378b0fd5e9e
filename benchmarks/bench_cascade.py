"""Cascade attention vs K expanded copies of each prompt's keys/values, side by side, at the tiny preset's shape (8
prompts of 200 tokens, K = 8, 16 new tokens, EOS suppressed), the same policy and seed, repetitions interleaved:

- sampling: ``generate`` with the cascade cache vs the reserved expanded cache (checks both sample the same
  tokens);
- update: the shared-prefix loss forward + backward as one prefix-tree forward with cascade attention vs two
  passes (prompts, then responses on the prompts' keys/values repeated K ways) (checks equal gradients).

Prints the median seconds of each.

    python benchmarks/bench_cascade.py [--threads 1] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from atgrpo.bench.common import Shape, interleaved, make_policy, prompt_texts, suppress_eos
from atgrpo.bench.update import loss_backward, make_batch
from atgrpo.config import AlgoConfig


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

    def sample(cascade: bool):
        def go():
            policy.cascade = cascade
            return policy.generate(prompts, shape.K, 1.0, shape.new_tokens, torch.Generator().manual_seed(0))
        return go

    a, b = sample(True)(), sample(False)()
    assert [c.ids for r in a for c in r] == [c.ids for r in b for c in r], "the two caches sampled different tokens"
    times = interleaved({"sampling, cascade": sample(True), "sampling, expanded": sample(False)}, args.reps, 1)

    policy.model.train()
    batch = make_batch(shape, policy)
    with torch.no_grad():
        old, _ = policy.response_logprobs(*batch, 1.0)
    adv = torch.randn(len(batch[0]), generator=torch.Generator().manual_seed(1))

    def update(cascade: bool):
        def go():
            policy.cascade = cascade
            policy.model.zero_grad(set_to_none=True)
            loss_backward(policy, *batch, old, adv, True, AlgoConfig())
            return [p.grad.clone() for p in policy.model.parameters()]
        return go

    diff = max(float((x - y).abs().max()) for x, y in zip(update(True)(), update(False)()))
    assert diff < 1e-5, f"the two update paths' gradients differ by {diff}"
    times |= interleaved({"update, cascade tree": update(True), "update, two passes expanded": update(False)},
                         args.reps, 1)
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.3f} s over {len(t)} repetitions")


if __name__ == "__main__":
    main()
