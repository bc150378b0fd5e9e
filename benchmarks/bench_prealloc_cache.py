"""Experiment (not used by the library): how much would a preallocated KV cache speed up ``generate``?

``CausalLMPolicy.generate`` uses transformers' ``DynamicCache``, whose ``update`` is ``torch.cat`` of the whole
cache with one new token per decode step: every step copies all P*K rows of prompt keys/values, per layer.
On the tiny policy at the issue's shape (8 prompts x 200 tokens, K=8, 16 tokens) that copying is most of the
rollout time. This script swaps in a cache layer that writes new keys/values into spare capacity in place
(amortised growth) and reruns ``atgrpo bench rollout`` with it, so the effect can be measured before anyone
changes the engine. Tokens are identical (checked).

    python benchmarks/bench_prealloc_cache.py [--threads 1] [--reps 5] [--out bench_out]
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers.cache_utils import Cache, DynamicLayer

import atgrpo.policies.causal_lm as causal_lm
from atgrpo.bench.common import Shape, make_policy, prompt_texts, suppress_eos
from atgrpo.bench.rollout import bench_rollout


class GrowLayer(DynamicLayer):
    """A DynamicLayer with spare capacity: new keys/values are written in place; only a regrow copies."""

    SPARE = 64

    def update(self, k, v, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(k, v)
            self._cap = 0
        n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        t = k.shape[-2]
        owned = self.keys.dim() == 4 and self.keys.data_ptr() == self._kb.data_ptr() and self._kb.shape[0] == k.shape[0]
        if not owned or n + t > self._cap:  # first use, after a batch select / repeat, or full: regrow
            cap = n + t + self.SPARE
            kb, vb = k.new_empty((*k.shape[:2], cap, k.shape[3])), v.new_empty((*v.shape[:2], cap, v.shape[3]))
            if n:
                kb[:, :, :n], vb[:, :, :n] = self.keys, self.values
            self._kb, self._vb, self._cap = kb, vb, cap
        self._kb[:, :, n:n + t], self._vb[:, :, n:n + t] = k, v
        self.keys, self.values = self._kb[:, :, :n + t], self._vb[:, :, :n + t]
        return self.keys, self.values


class GrowCache(Cache):
    def __init__(self):
        super().__init__(layer_class_to_replicate=GrowLayer)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = Shape(reps=args.reps)
    policy = make_policy(shape)
    hook = suppress_eos(policy.model)
    prompts = [policy.encode(t) for t in prompt_texts(shape)]
    outs = []
    for cache_cls in (causal_lm.DynamicCache, GrowCache):
        causal_lm.DynamicCache = cache_cls
        outs.append(policy.generate(prompts, shape.K, 1.0, shape.new_tokens, torch.Generator().manual_seed(0)))
    assert [c.ids for r in outs[0] for c in r] == [c.ids for r in outs[1] for c in r], "tokens differ"
    hook.remove()
    cmd = "python benchmarks/bench_prealloc_cache.py" + (f" --threads {args.threads}" if args.threads else "")
    result = bench_rollout(shape, args.out, "rollout_prealloc_cache_experiment", cmd)
    print(json.dumps({"ratios": result["ratios"],
                      "median_s": {m: round(v["median_s"], 3) for m, v in result["methods"].items()}}))


if __name__ == "__main__":
    main()
