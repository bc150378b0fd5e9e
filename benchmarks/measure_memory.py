"""Peak memory of one real AT-GRPO training step on the CPU, to check ``atgrpo plan-memory`` against.

    OMP_NUM_THREADS=1 python benchmarks/measure_memory.py [CONFIG.yaml] [dotted.key=value ...]

Builds the run's state exactly as ``atgrpo train`` does (no warm start, no evaluation, no checkpoint) and runs one
``train_step``. Memory is the process's resident set from /proc/self/status: ``VmRSS`` before the policies are
built (torch, transformers and atgrpo already imported), after they are built, and the peak of the step
(``trainer/memory.py``: reset after the build, kept across the step's per-phase resets) and of each of its phases
(the step's ``perf/peak_rss_mb/rollout`` and ``/update``). Prints one JSON object (MiB) with the lengths the step
saw, so the plan can be made with the same lengths (``atgrpo plan-memory ... --prompt-tokens N``).
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> dict:
    import torch

    from atgrpo.cli import _split_args
    from atgrpo.config import load_config
    from atgrpo.trainer.memory import peak_rss_mib, reset_peak_rss
    from atgrpo.trainer.metrics import rss_mb
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked
    from atgrpo.trainer.step import train_step

    path, overrides = _split_args(argv)
    cfg = set_precision(load_config(path, overrides), lambda *a: None)  # model.precision=auto as the run resolves it
    torch.set_num_threads(max(1, cfg.train.threads))
    before = rss_mb()
    state = build_state_checked(cfg)
    built = rss_mb()
    reset_peak_rss()
    t = time.perf_counter()
    result = train_step(state, 0)
    seconds = time.perf_counter() - t
    peak = peak_rss_mib()
    prompts = [len(s.prompt_ids) for s in result.samples]
    responses = [len(s.response_ids) for s in result.samples]
    return {
        "config": path, "overrides": overrides, "sharing": cfg.policy.sharing, "dtype": cfg.model.dtype,
        "precision": cfg.model.precision,
        "rss_before_build_mib": round(before, 1), "rss_after_build_mib": round(built, 1),
        "peak_step_mib": round(peak, 1), "build_growth_mib": round(built - before, 1),
        "peak_growth_mib": round(peak - before, 1),
        "phase_growth_mib": {k: round(v - before, 1) for k, v in result.peaks.items()},
        "samples": len(result.samples), "prompt_tokens_max": max(prompts), "prompt_tokens_mean":
            round(sum(prompts) / len(prompts), 1), "response_tokens_max": max(responses),
        "optimizer_steps": {pid: u.optimizer_steps for pid, u in result.updates.items()},
        "update_tokens": {pid: u.tokens for pid, u in result.updates.items()}, "step_seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
