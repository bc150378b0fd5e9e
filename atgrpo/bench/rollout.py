"""Rollout throughput: the tree-style batched ``generate`` against two ways of sampling the same K branches.

- ``tree``: ``CausalLMPolicy.generate(prompts, n=K)``: every prompt prefilled once in one batch, its KV cache
  expanded K ways, all P*K branches decoded together (what AT-GRPO's rollout runs at each node).
- ``naive_loop``: one request per branch, ``generate([prompt], n=1)`` K times per prompt (how the reference
  code issues requests: each branch its own prompt and decode).
- ``hf_generate``: transformers ``model.generate(do_sample=True, num_return_sequences=K, top_k=0, top_p=1.0)``
  on the same left-padded batch (it repeats each prompt K times *before* the prefill).

With ``precisions`` holding ``bfloat16``, also ``tree_bf16_copy``: the tree sampler on a bfloat16 copy of the
policy (``policies/rollout_copy.py``), what a ``model.precision=bfloat16`` run's rollout does (its MFU against the
bfloat16 peak). The trainer's log-probs of what it sampled are the update's business (``bench step`` times the
whole step); after the timing they are taken once, as the update takes them, for the log-prob gap.

Same model, prompts, temperature 1, float32 unless said otherwise; EOS is suppressed in all three so each produces exactly
P * K * new_tokens tokens (checked). With a real model (``--preset smollm2``: chat prompts through its template)
the naive loop is left out: it prefills each prompt K times over, and the target is set against
``num_return_sequences``. MFU: model FLOPs (2 x parameters per token the method runs through the model, prompt
tokens included: the tree prefills P prompts, ``num_return_sequences`` P * K) over the measured matmul peak.
"""

from __future__ import annotations

import torch

from .common import (Shape, bench_prompts, bf16_rollout_view, interleaved, machine, make_policy, matmul_peaks, mfu,
                     peaks_note, percent, shape_dict, summarize, suppress_eos, write_report)


def bench_rollout(shape: Shape, out_dir: str, name: str = "rollout", command: str | None = None,
                  peak_n: int = 2048, precisions: tuple[str, ...] = ("float32",)) -> dict:
    policy = make_policy(shape)
    policy.model.eval()
    hook = suppress_eos(policy.model, policy.eos_id)
    prompts = [policy.encode(t) for t in bench_prompts(shape, policy)]
    P, K, T = len(prompts), shape.K, shape.new_tokens
    gen = torch.Generator().manual_seed(shape.seed)
    Lp = max(map(len, prompts))
    ids = torch.full((P, Lp), policy.pad_id, dtype=torch.long)
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
                                        pad_token_id=policy.pad_id, eos_token_id=policy.eos_id)
        new = out[:, Lp:]
        counts["hf_generate"] = new.numel() if new.shape[1] == T and not bool((new == policy.eos_id).any()) else -1

    methods = {"tree": tree, "naive_loop": naive_loop, "hf_generate": hf_generate}
    if shape.model != "tiny":
        del methods["naive_loop"]
    gap, last = {}, {}
    if "bfloat16" in precisions:
        view = bf16_rollout_view(policy)

        def tree_bf16_copy():
            last["out"] = view.generate(prompts, K, 1.0, T, gen)
            counts["tree_bf16_copy"] = sum(len(c.ids) for row in last["out"] for c in row)

        methods["tree_bf16_copy"] = tree_bf16_copy
    try:
        times = interleaved(methods, shape.reps, shape.warmup)
        if last:
            gap = copy_gap(view.policy, prompts, last["out"], shape.algo())
    finally:
        hook.remove()
    expect = P * K * T
    assert all(c == expect for c in counts.values()), f"unequal token counts {counts}, expected {expect} each"
    peaks, cpu = matmul_peaks(peak_n), machine()
    n_params = policy.num_parameters()
    prompt_tokens = sum(map(len, prompts))
    flops = {"tree": 2 * n_params * (prompt_tokens + expect), "naive_loop": 2 * n_params * (K * prompt_tokens + expect),
             "hf_generate": 2 * n_params * (K * P * Lp + expect),
             "tree_bf16_copy": 2 * n_params * (prompt_tokens + expect)}
    res = {m: summarize(times[m], expect) for m in methods}
    for m in methods:
        res[m]["precision"] = "bfloat16" if m == "tree_bf16_copy" else "float32"
        res[m]["model_flops"] = flops[m]
        res[m]["mfu"] = mfu(flops[m], res[m]["median_s"], res[m]["precision"], peaks, cpu)
    ratios = {f"tree_vs_{m}": res[m]["median_s"] / res["tree"]["median_s"] for m in methods
              if m not in ("tree", "tree_bf16_copy")}
    if "tree_bf16_copy" in res:
        ratios["tree_bf16_copy_vs_tree"] = res["tree"]["median_s"] / res["tree_bf16_copy"]["median_s"]
    bf16_native = bool(cpu["bf16_units"])
    targets = {"tree_vs_naive_loop": 8.0, "tree_vs_hf_generate": 2.5}
    if bf16_native:  # on a CPU that emulates bfloat16 the copy is slower: no target there
        targets["tree_bf16_copy_vs_tree"] = 3.0
    result = {"bench": "rollout", "shape": shape_dict(shape), "machine": cpu, "methods": res,
              "ratios": ratios, "targets": {k: v for k, v in targets.items() if k in ratios},
              "matmul_peak_flops": peaks["float32"], "matmul_peaks": peaks, "logprob_gap": gap, "params": n_params,
              "command": command}
    rows = [(m, res[m]["precision"], expect, res[m]["median_s"], res[m]["tokens_per_s"], res["tree"]["tokens_per_s"] /
             res[m]["tokens_per_s"], percent(res[m]["mfu"])) for m in methods]
    notes = [f"{k.replace('_vs_', ' vs ')}: {v:.2f}x" + (f" (target >= {targets[k]:g}x)" if k in targets else "")
             for k, v in ratios.items()]
    if gap:
        key = f"rollout/logprob_gap/{policy.policy_id}"
        notes.append(f"bfloat16 copy vs the trainer's log-probs: mean gap {gap[key + '/mean']:.4f}, max "
                     f"{gap[key + '/max']:.3f}" + ("" if bf16_native else
                                                   "; this CPU emulates bfloat16: the copy cannot be faster here"))
    notes.append(peaks_note(peaks, cpu))
    notes.append(f"params {n_params}; model {shape.model}")
    write_report(out_dir, name, result, rows, ("method", "precision", "tokens", "median s", "tokens/s",
                                               "tree speed-up", "MFU %"),
                 notes)
    return result


def copy_gap(trainer, prompts: list[list[int]], comps, algo, temperature: float = 1.0) -> dict[str, float]:
    """``rollout/logprob_gap/<policy>/{mean,max}`` of the copy's completions ``comps``: the trainer's log-probs
    taken as the update takes them (``take_trainer_logprobs``, micro-batched as ``update_policy`` does)."""
    from ..rollout.logprob_gap import LogprobGap
    from ..rollout.records import Sample
    from ..trainer.update import micro_batches, score_owed

    samples = [Sample(problem=f"p{i}", branch=k, turn=0, agent="solo", policy=trainer.policy_id, prompt="",
                      prompt_ids=p, response="", response_ids=c.ids, logprobs=c.logprobs, reward_team=0.0,
                      reward_local=0.0, reward=0.0, selected=k == 0, finished=c.finished, temperature=temperature,
                      trainer_logprobs=False)
               for i, (p, row) in enumerate(zip(prompts, comps)) for k, c in enumerate(row)]
    gap = LogprobGap()
    score_owed(trainer, micro_batches(samples, algo), algo, temperature, gap)
    return gap.pop()
