"""The table ``atgrpo plan-memory`` prints: the settings, one row per model, the dominant term, and the GPUs the
run needs (``plan_memory``'s terms and ``fit_gpus``)."""

from __future__ import annotations

import math
from dataclasses import replace

from .model_shapes import ModelShape, num_params
from .plan_memory import GIB, RunSettings, fit_gpus, micro_batch, plan


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def format_plan(s: ModelShape, r: RunSettings, gpu_gb: float) -> str:
    """The table ``atgrpo plan-memory`` prints: the settings, one row per model (GiB), the dominant term, and the
    GPUs of ``gpu_gb`` GiB the run needs."""
    plans, mb = plan(s, r), micro_batch(r)
    on_gpu = replace(r, device="cuda")  # the GPU counts hold the CUDA runtime term whatever model.device says
    fit = fit_gpus(plan(s, on_gpu), on_gpu, int(gpu_gb * GIB))
    how = "shared prefix" if r.shared_prefix else "one sequence per sample"
    lines = [f"{s.name or 'model'}: {num_params(s) / 1e6:,.1f}M parameters, {r.sharing} ({r.roles} "
             f"{'policy' if r.roles == 1 else 'policies'}), "
             f"{r.dtype}{f' (autocast {r.compute_dtype})' if r.compute_dtype else ''} on {r.device}, K={r.K}, {r.problems} problems per step, prompt {r.prompt_tokens} + {r.new_tokens} new "
             f"tokens",
             f"largest update micro-batch ({how}{', gradient checkpointing' if r.gradient_checkpointing else ''}): "
             f"{mb.groups} prompts, {mb.rows} responses, {mb.tokens:,} tokens, logits at {mb.logit_rows:,} positions",
             "",
             f"{'model':<20} {'params':>9} {'trainable':>10} {'weights':>8} {'sampler':>8} {'grads':>8} "
             f"{'optimizer':>9} {'activ.':>8} {'kv_cache':>8} {'sampling':>8} {'packed':>8} {'runtime':>8} {'peak':>8}  "
             f"GPUs of {gpu_gb:g} GiB"]
    for p in plans:
        lines.append(f"{p.name:<20} {p.params / 1e6:>8.1f}M {p.trainable / 1e6:>9.2f}M {_gib(p.weights):>8} "
                     f"{_gib(p.sampler):>8} {_gib(p.grads):>8} {_gib(p.optimizer):>9} {_gib(p.activations):>8} "
                     f"{_gib(p.kv_cache):>8} {_gib(p.sampling):>8} {_gib(p.packed):>8} {_gib(p.runtime):>8} {_gib(p.peak):>8}  "
                     f"{math.ceil(p.peak / (gpu_gb * GIB))}")
    lines += ["(GiB; peak = weights + optimizer + max(grads + activations, kv_cache + sampling + packed + sampler) "
              "+ runtime" + (" + the KL reference's copies" if r.kl_reference else "")
              + "; sampler: the rollout's bfloat16 copy, freed for the update (L2: its frozen base held throughout); "
              "packed: the CPU engine's prepacked weights, rollout only)", ""]
    if r.kl_reference:
        lines += [f"KL reference (algo.kl_coef > 0) of {p.name}: {_gib(p.reference)} GiB" for p in plans]
    for p in plans:
        lines.append(f"dominant term of {p.name}: {p.dominant()}")
    lines.append(f"one GPU of {gpu_gb:g} GiB (local backend, model.device=cuda): needs {_gib(fit.local_bytes)} GiB: "
                 + ("fits: 1 GPU" if fit.local_fits else "does not fit"))
    ray = "several GPUs (system.backend=ray system.ray.gpus_per_worker=1"
    if fit.ray_gpus is None:
        ray += (f"): a worker does not fit one GPU (update worker {_gib(fit.update_worker_bytes)} GiB, rollout "
                f"worker {_gib(fit.rollout_worker_bytes)} GiB): lower algo.update_token_budget or "
                "rollout.problems_per_step, use L2 or bfloat16, or model.gradient_checkpointing=true, or larger GPUs")
    else:
        sharded = (f" system.ray.num_update_workers={fit.update_workers} system.ray.update_sharding=fsdp"
                   if fit.update_workers > 1 else "")
        ray += (f" system.ray.num_rollout_workers={fit.rollout_workers}{sharded}): {fit.ray_gpus} GPUs: per policy "
                f"pool (x{fit.pools}) {fit.rollout_workers} rollout worker{'s' if fit.rollout_workers > 1 else ''} "
                f"of {_gib(fit.rollout_worker_bytes)} GiB + {fit.update_workers} update worker"
                f"{'s (FSDP ranks)' if fit.update_workers > 1 else ''} of {_gib(fit.update_worker_bytes)} GiB"
                + (" each" if fit.update_workers > 1 else ""))
    lines.append(ray)
    return "\n".join(lines)
