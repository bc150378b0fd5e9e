"""The planner's table for Qwen3-1.7B and Qwen3-8B at the paper's lengths (docs/models.md, "Memory planning").

    python benchmarks/plan_table.py [--budget 8192] [--gpu-gb 80]

Each row is ``atgrpo plan-memory configs/gpu_smollm2.yaml model.max_prompt_tokens=4096
rollout.max_new_tokens=2048 model.gradient_checkpointing=true algo.update_token_budget=BUDGET
policy.sharing=S model.dtype=D [model.autocast=bfloat16] rollout.problems_per_step=N --model M``, with 8
problems per step for the one-GPU column and 32 for the Ray column; the same functions, no torch imported.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from atgrpo import plan_memory as pm
from atgrpo.config.loading import read_config

PRECISIONS = {"bfloat16": ("bfloat16", "none"), "float32 + autocast": ("float32", "bfloat16")}


def row(model: str, sharing: str, precision: str, budget: int, gpu_gb: float) -> str:
    dtype, autocast = PRECISIONS[precision]
    cfg = read_config("configs/gpu_smollm2.yaml", [
        "model.max_prompt_tokens=4096", "rollout.max_new_tokens=2048", "model.gradient_checkpointing=true",
        f"algo.update_token_budget={budget}", f"policy.sharing={sharing}", f"model.dtype={dtype}",
        f"model.autocast={autocast}"])
    shape = pm.BUILTIN_SHAPES[model]
    base = pm.settings_from_config(cfg, 2)
    gib = lambda n: f"{n / pm.GIB:.1f}"  # noqa: E731
    few, many = (replace(base, problems=n, device="cuda") for n in (8, 32))
    one = pm.fit_gpus(pm.plan(shape, few), few, int(gpu_gb * pm.GIB))
    plans = pm.plan(shape, many)
    ray = pm.fit_gpus(plans, many, int(gpu_gb * pm.GIB))
    p = plans[0]
    local = f"{'fits' if one.local_fits else 'no'} ({gib(one.local_bytes)} GiB)"
    if ray.ray_gpus is None:
        several = "does not fit"
    else:
        upd = (f"{ray.update_workers} FSDP update ranks of {gib(ray.update_worker_bytes)}" if ray.update_workers > 1
               else f"1 update of {gib(ray.update_worker_bytes)}")
        several = (f"{ray.ray_gpus} GPUs: {ray.pools} x ({ray.rollout_workers} rollout of "
                   f"{gib(ray.rollout_worker_bytes)} + {upd})")
    kv_few = pm.kv_cache_bytes(shape, few)
    return (f"| {shape.name} | {sharing}, {precision} | {gib(p.weights)} | {gib(p.grads)} | {gib(p.optimizer)} | "
            f"{gib(p.activations)} | {gib(p.kv_cache)} / {gib(kv_few)} | {local} | {several} |")


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=8192, help="algo.update_token_budget")
    ap.add_argument("--gpu-gb", type=float, default=80)
    args = ap.parse_args(argv)
    lines = ["| model | sharing, dtype | weights | grads | AdamW | activations | KV cache (32 / 8 problems) | "
             "one GPU: 8 problems per step | several GPUs (Ray): 32 problems per step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model in ("qwen3-1.7b", "qwen3-8b"):
        for sharing in ("L1", "L2", "L3"):
            for precision in PRECISIONS:
                lines.append(row(model, sharing, precision, args.budget, args.gpu_gb))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
