"""Rollout throughput: the tree-style batched ``generate`` against two ways of sampling the same K branches.

- ``tree``: ``CausalLMPolicy.generate(prompts, n=K)``: every prompt prefilled once in one batch, its KV cache
  expanded K ways, all P*K branches decoded together (what AT-GRPO's rollout runs at each node).
- ``naive_loop``: one request per branch, ``generate([prompt], n=1)`` K times per prompt (how the reference
  code issues requests: each branch its own prompt and decode).
- ``hf_generate``: transformers ``model.generate(do_sample=True, num_return_sequences=K, top_k=0, top_p=1.0)``
  on the same left-padded batch (it repeats each prompt K times *before* the prefill).

Same model, prompts, temperature 1, float32; EOS is suppressed in all three so each produces exactly
P * K * new_tokens tokens (checked).
"""

from __future__ import annotations

import torch

from ..policies.tokenizer import EOS, PAD
from .common import (Shape, interleaved, machine, make_policy, prompt_texts, shape_dict, summarize, suppress_eos,
                     write_report)


def bench_rollout(shape: Shape, out_dir: str, name: str = "rollout", command: str | None = None) -> dict:
    policy = make_policy(shape)
    policy.model.eval()
    hook = suppress_eos(policy.model)
    prompts = [policy.encode(t) for t in prompt_texts(shape)]
    P, K, T = len(prompts), shape.K, shape.new_tokens
    gen = torch.Generator().manual_seed(shape.seed)
    Lp = max(map(len, prompts))
    ids = torch.full((P, Lp), PAD, dtype=torch.long)
    attn = torch.zeros((P, Lp), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as generate expects for a decoder-only model
        ids[i, Lp - len(p):] = torch.tensor(p)
        attn[i, Lp - len(p):] = 1
    counts: dict[str, int] = {}

    def tree():
        out = policy.generate(prompts, K, 1.0, T, gen)
        counts["tree"] = sum(len(c.ids) for row in out for c in row)

    def naive_loop():
        n = 0
        for p in prompts:
            for _ in range(K):
                n += len(policy.generate([p], 1, 1.0, T, gen)[0][0].ids)
        counts["naive_loop"] = n

    def hf_generate():
        with torch.no_grad():
            out = policy.model.generate(input_ids=ids, attention_mask=attn, do_sample=True, num_return_sequences=K,
                                        top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=T,
                                        pad_token_id=PAD, eos_token_id=EOS)
        new = out[:, Lp:]
        counts["hf_generate"] = new.numel() if new.shape[1] == T and not bool((new == EOS).any()) else -1

    methods = {"tree": tree, "naive_loop": naive_loop, "hf_generate": hf_generate}
    try:
        times = interleaved(methods, shape.reps, shape.warmup)
    finally:
        hook.remove()
    expect = P * K * T
    assert all(c == expect for c in counts.values()), f"unequal token counts {counts}, expected {expect} each"
    res = {m: summarize(times[m], expect) for m in methods}
    ratios = {"tree_vs_naive_loop": res["naive_loop"]["median_s"] / res["tree"]["median_s"],
              "tree_vs_hf_generate": res["hf_generate"]["median_s"] / res["tree"]["median_s"]}
    result = {"bench": "rollout", "shape": shape_dict(shape), "machine": machine(), "methods": res,
              "ratios": ratios, "targets": {"tree_vs_naive_loop": 8.0, "tree_vs_hf_generate": 2.5},
              "command": command}
    rows = [(m, expect, res[m]["median_s"], res[m]["tokens_per_s"], res["tree"]["tokens_per_s"] /
             res[m]["tokens_per_s"]) for m in methods]
    write_report(out_dir, name, result, rows, ("method", "tokens", "median s", "tokens/s", "tree speed-up"),
                 [f"tree vs naive loop: {ratios['tree_vs_naive_loop']:.2f}x (target >= 8x)",
                  f"tree vs num_return_sequences: {ratios['tree_vs_hf_generate']:.2f}x (target >= 2.5x)"])
    return result
