"""Update throughput: the shared-prefix loss against one sequence per sample, forward + backward.

Both run the same PPO loss (``policy_loss``, token-mean) on the same P * K samples (K responses of exactly
``new_tokens`` tokens to each prompt), micro-batched as ``update_policy`` does (the shape's ``algo()`` settings).
Before timing, both compute the gradient once and the report says how far apart they are (they must agree to
float rounding). Model FLOPs utilization (MFU) is measured against the machine's float32 matmul peak
(``matmul_peak_flops``; the bfloat16 peak for ``shared_prefix_bf16``, the loss under bfloat16 autocast on float32
master weights, run with ``precisions`` holding bfloat16); FLOPs = 6 * parameters * tokens the method actually runs + attention
(12 * layers * hidden * keys attended, per query token). The per-sample method runs ~``K(P+T)/(P+KT)`` times the
tokens, so its MFU can be higher while it is slower: the speed-up is the number that counts.
"""

from __future__ import annotations

import torch

from ..algorithms.losses import policy_loss
from ..config import AlgoConfig
from ..policies.shared_prefix import group_by_prompt, plan_chunks, shared_prefix_logprobs
from .common import (Shape, autocast_twin, bench_prompts, interleaved, machine, make_policy, matmul_peaks, mfu,
                     peaks_note, percent, response_token_range, shape_dict, summarize, write_report)


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
                 peak_n: int = 2048, precisions: tuple[str, ...] = ("float32",)) -> dict:
    policy = make_policy(shape)
    policy.model.train()
    algo = shape.algo()
    prompts, responses = make_batch(shape, policy)
    with torch.no_grad():
        old, _ = policy.response_logprobs(prompts, responses, 1.0)  # (B, T) "sampling-time" log-probs
    adv = torch.randn(len(prompts), generator=torch.Generator().manual_seed(shape.seed + 2))
    # method -> (policy, shared prefix, precision); the autocast twin is what model.precision=bfloat16 trains
    runs = {"per_sample": (policy, False, "float32"), "shared_prefix": (policy, True, "float32")}
    if "bfloat16" in precisions:
        runs["shared_prefix_bf16"] = (autocast_twin(policy), True, "bfloat16")
    grads, losses = {}, {}
    for m, (pol, shared, _) in runs.items():
        pol.model.zero_grad(set_to_none=True)
        losses[m] = loss_backward(pol, prompts, responses, old, adv, shared, algo)
        grads[m] = [p.grad.clone() for p in pol.model.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["per_sample"], grads["shared_prefix"]))
    scale = max(float(a.abs().max()) for a in grads["per_sample"])
    bf16_rel = None
    if "shared_prefix_bf16" in grads:  # bfloat16 rounding of the gradient, relative to its float32 norm
        ref, got = (torch.cat([g.flatten() for g in grads[m]]) for m in ("shared_prefix", "shared_prefix_bf16"))
        bf16_rel = float((got - ref).norm() / ref.norm())

    def run(pol, shared):
        def f():
            pol.model.zero_grad(set_to_none=True)
            loss_backward(pol, prompts, responses, old, adv, shared, algo)
        return f

    times = interleaved({m: run(pol, shared) for m, (pol, shared, _) in runs.items()}, shape.reps, shape.warmup)
    peaks, cpu = matmul_peaks(peak_n), machine()
    peak = peaks["float32"]
    tokens = sum(len(r) for r in responses)
    res = {}
    for m, (_, shared, precision) in runs.items():
        res[m] = summarize(times[m], tokens)
        res[m]["precision"] = precision
        res[m]["model_flops"] = model_flops(policy, prompts, responses, shared)
        res[m]["mfu"] = mfu(res[m]["model_flops"], res[m]["median_s"], precision, peaks, cpu)
    speedup = res["per_sample"]["median_s"] / res["shared_prefix"]["median_s"]
    flop_bound = res["per_sample"]["model_flops"] / res["shared_prefix"]["model_flops"]
    # the tiny preset's target; a real model's shape has its own FLOP bound (SmolLM2 preset: 3.6x), the report
    # gives the speed-up as a share of it
    targets = {"shared_prefix_vs_per_sample": 4.5} if shape.model == "tiny" else {}
    ratios = {"shared_prefix_vs_per_sample": speedup}
    notes = [f"shared-prefix vs per-sample: {speedup:.2f}x, {100 * speedup / flop_bound:.0f}% of the FLOP bound "
             f"{flop_bound:.2f}x" + (" (target >= 4.5x)" if targets else ""),
             f"gradients: max |diff| {diff:.2e} (max |grad| {scale:.2e}); losses {losses}"]
    if bf16_rel is not None:
        ratios["shared_prefix_bf16_vs_shared_prefix"] = (res["shared_prefix"]["median_s"]
                                                        / res["shared_prefix_bf16"]["median_s"])
        if cpu["bf16_units"]:
            targets["shared_prefix_bf16_vs_shared_prefix"] = 2.0
        notes.append(f"bfloat16 autocast vs float32 (shared prefix): "
                     f"{ratios['shared_prefix_bf16_vs_shared_prefix']:.2f}x; gradient |diff| / |grad| {bf16_rel:.4f}")
    result = {"bench": "update", "shape": shape_dict(shape), "machine": cpu, "methods": res,
              "ratios": ratios, "flop_bound": flop_bound, "targets": targets,
              "matmul_peak_flops": peak, "matmul_peaks": peaks, "grad_max_abs_diff": diff, "grad_max_abs": scale,
              "grad_rel_diff_bf16": bf16_rel, "loss": losses, "grads_equal": diff <= 1e-5 + 1e-4 * scale,
              "params": policy.num_parameters(), "command": command}
    rows = [(m, res[m]["precision"], tokens, res[m]["median_s"], res[m]["tokens_per_s"], res[m]["model_flops"] / 1e9,
             percent(res[m]["mfu"])) for m in res]
    write_report(out_dir, name, result, rows, ("method", "precision", "response tokens", "median s", "tokens/s",
                                               "GFLOP", "MFU %"),
                 notes + [peaks_note(peaks, cpu), f"params {policy.num_parameters()}; model {shape.model}"])
    return result
