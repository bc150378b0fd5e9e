"""Resident-memory growth of one shared-prefix micro-batch's forward and backward (gradients already allocated),
on the Plan-Path cell's SmolLM2-135M: a prompt of 2,400 tokens with a 60-token answer and one of 150 + 20, about a
warm-start micro-batch of that task.

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/microbatch_peak.py   # the resident set follows live tensors

Prints JSON: (growth in MiB over the resident set before, seconds) for three repetitions, the allocator's free
memory handed back before each.
"""

from __future__ import annotations

import json
import time


def main() -> dict:
    import torch

    from atgrpo.config import load_config
    from atgrpo.policies.shared_prefix import shared_prefix_logprobs
    from atgrpo.trainer.memory import peak_rss_mib, release_free_memory, reset_peak_rss
    from atgrpo.trainer.metrics import rss_mb
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked

    cfg = set_precision(load_config("configs/real/table/plan_path_mas_L1.yaml", ["warmstart.enabled=false"]),
                        lambda *a: None)
    torch.set_num_threads(2)
    policy = next(iter(build_state_checked(cfg).policies.values()))
    g = torch.Generator().manual_seed(0)
    lens = [(2400, 60), (150, 20)]
    prompts = [torch.randint(100, 40000, (p,), generator=g).tolist() for p, _ in lens]
    answers = [torch.randint(100, 40000, (a,), generator=g).tolist() for _, a in lens]

    def micro_batch() -> None:
        logp, mask = shared_prefix_logprobs(policy, prompts, answers, 1.0)
        (-(logp * mask).sum()).backward()

    micro_batch()  # the gradients exist from here on, as in training
    out = []
    for _ in range(3):
        release_free_memory()
        before = rss_mb()
        reset_peak_rss()
        t = time.perf_counter()
        micro_batch()
        out.append((round(peak_rss_mib() - before), round(time.perf_counter() - t, 2)))
    return {"tokens": sum(p + a for p, a in lens), "growth_mib_and_s": out}


if __name__ == "__main__":
    print(json.dumps(main()))
