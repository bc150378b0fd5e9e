"""Update throughput: the shared-prefix loss against one sequence per sample, forward + backward.

Both run the same PPO loss (``policy_loss``, token-mean) on the same P * K samples (K responses of exactly
``new_tokens`` tokens to each prompt), micro-batched as ``update_policy`` does (the shape's ``algo()`` settings).
Before timing, both compute the gradient once and the report says how far apart they are (they must agree to
float rounding). Model FLOPs utilization (MFU) is measured against the machine's float32 matmul peak
(``matmul_peak_flops``); FLOPs = 6 * parameters * tokens the method actually runs + attention
(12 * layers * hidden * keys attended, per query token). The per-sample method runs ~``K(P+T)/(P+KT)`` times the
tokens, so its MFU can be higher while it is slower: the speed-up is the number that counts.
"""

from __future__ import annotations

import torch

from ..algorithms.losses import policy_loss
from ..config import AlgoConfig
from ..policies.shared_prefix import group_by_prompt, plan_chunks, shared_prefix_logprobs
from .common import (Shape, bench_prompts, interleaved, machine, make_policy, matmul_peak_flops,
                     response_token_range, shape_dict, summarize, write_report)


def make_batch(shape: Shape, policy) -> tuple[list[list[int]], list[list[int]]]:
    """P prompts, each repeated K times, and K random responses of ``new_tokens`` tokens to each (seeded)."""
    g = torch.Generator().manual_seed(shape.seed + 1)
    lo, hi = response_token_range(policy)
    prompts, responses = [], []
    for text in bench_prompts(shape, policy):
        p = policy.encode(text)
        for _ in range(shape.K):
            prompts.append(p)
            responses.append(torch.randint(lo, hi, (shape.new_tokens,), generator=g).tolist())
    return prompts, responses


def loss_backward(policy, prompts, responses, old, adv, shared: bool, algo: AlgoConfig) -> float:
    """One forward + backward of the whole batch, micro-batched as ``update_policy`` does; returns the loss."""
    n = len(prompts)
    if shared:
        chunks = plan_chunks(prompts, responses, algo.update_token_budget, algo.micro_batch_size)
    else:
        chunks = [list(range(s, min(n, s + algo.micro_batch_size))) for s in range(0, n, algo.micro_batch_size)]
    normalizer = float(sum(len(r) for r in responses))
    total = 0.0
    for idx in chunks:
        p, r = [prompts[i] for i in idx], [responses[i] for i in idx]
        logp, mask = (shared_prefix_logprobs(policy, p, r, 1.0) if shared else policy.response_logprobs(p, r, 1.0))
        loss, _ = policy_loss(logp, old[idx], adv[idx], mask, aggregation=algo.aggregation, normalizer=normalizer)
        loss.backward()
        total += float(loss.detach())
    return total


def model_flops(policy, prompts, responses, shared: bool) -> float:
    """Approximate FLOPs of one forward + backward (see the module docstring)."""
    cfg = policy.model.config
    n_params = sum(p.numel() for p in policy.model.parameters())
    attn = 12 * cfg.num_hidden_layers * cfg.hidden_size
    if not shared:
        lens = [len(p) + len(r) - 1 for p, r in zip(prompts, responses)]
        return sum(6 * n_params * L + attn * L * (L + 1) / 2 for L in lens)
    total = 0.0
    for g in group_by_prompt(prompts):
        lp = len(prompts[g[0]])
        total += 6 * n_params * lp + attn * lp * (lp + 1) / 2
        for i in g:
            t = len(responses[i]) - 1
            total += 6 * n_params * t + attn * (t * lp + t * (t + 1) / 2)
    return total


def bench_update(shape: Shape, out_dir: str, name: str = "update", command: str | None = None,
                 peak_n: int = 2048) -> dict:
    policy = make_policy(shape)
    policy.model.train()
    algo = shape.algo()
    prompts, responses = make_batch(shape, policy)
    with torch.no_grad():
        old, _ = policy.response_logprobs(prompts, responses, 1.0)  # (B, T) "sampling-time" log-probs
    adv = torch.randn(len(prompts), generator=torch.Generator().manual_seed(shape.seed + 2))
    grads, losses = {}, {}
    for m, shared in (("per_sample", False), ("shared_prefix", True)):
        policy.model.zero_grad(set_to_none=True)
        losses[m] = loss_backward(policy, prompts, responses, old, adv, shared, algo)
        grads[m] = [p.grad.clone() for p in policy.model.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["per_sample"], grads["shared_prefix"]))
    scale = max(float(a.abs().max()) for a in grads["per_sample"])

    def run(shared):
        def f():
            policy.model.zero_grad(set_to_none=True)
            loss_backward(policy, prompts, responses, old, adv, shared, algo)
        return f

    times = interleaved({"per_sample": run(False), "shared_prefix": run(True)}, shape.reps, shape.warmup)
    peak = matmul_peak_flops(peak_n)
    tokens = sum(len(r) for r in responses)
    res = {}
    for m, shared in (("per_sample", False), ("shared_prefix", True)):
        res[m] = summarize(times[m], tokens)
        res[m]["model_flops"] = model_flops(policy, prompts, responses, shared)
        res[m]["mfu"] = res[m]["model_flops"] / res[m]["median_s"] / peak
    speedup = res["per_sample"]["median_s"] / res["shared_prefix"]["median_s"]
    flop_bound = res["per_sample"]["model_flops"] / res["shared_prefix"]["model_flops"]
    # the tiny preset's target; a real model's shape has its own FLOP bound (SmolLM2 preset: 3.6x), the report
    # gives the speed-up as a share of it
    targets = {"shared_prefix_vs_per_sample": 4.5} if shape.model == "tiny" else {}
    result = {"bench": "update", "shape": shape_dict(shape), "machine": machine(), "methods": res,
              "ratios": {"shared_prefix_vs_per_sample": speedup}, "flop_bound": flop_bound, "targets": targets,
              "matmul_peak_flops": peak, "grad_max_abs_diff": diff, "grad_max_abs": scale,
              "loss": losses, "grads_equal": diff <= 1e-5 + 1e-4 * scale,
              "params": policy.num_parameters(), "command": command}
    rows = [(m, tokens, res[m]["median_s"], res[m]["tokens_per_s"], res[m]["model_flops"] / 1e9,
             100 * res[m]["mfu"]) for m in res]
    write_report(out_dir, name, result, rows, ("method", "response tokens", "median s", "tokens/s",
                                               "GFLOP", "MFU %"),
                 [f"shared-prefix vs per-sample: {speedup:.2f}x, {100 * speedup / flop_bound:.0f}% of the FLOP bound "
                  f"{flop_bound:.2f}x" + (" (target >= 4.5x)" if targets else ""),
                  f"gradients: max |diff| {diff:.2e} (max |grad| {scale:.2e}); losses {losses}",
                  f"matmul peak {peak / 1e9:.1f} GFLOP/s ({peak_n}^3 float32); params {policy.num_parameters()}; "
                  f"model {shape.model}"])
    return result
