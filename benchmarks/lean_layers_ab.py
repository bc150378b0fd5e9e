"""Stock transformers norms and MLPs against ``policies/lean_layers.py``, interleaved in one process: the time
of one warm-start batch (``warmstart.batch_cross_entropy``, forward and backward) on the Plan-Path cell's
SmolLM2-135M, 4 random samples of 900 + 100 tokens.

    python benchmarks/lean_layers_ab.py [REPS] [TOKEN_BUDGET]

Prints JSON: per variant the minimum, the median and every timed repetition (seconds), after one untimed round.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(reps: int, budget: int) -> dict:
    import torch

    from atgrpo.config import load_config
    from atgrpo.policies.lean_layers import make_lean, restore
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked
    from atgrpo.trainer.warmstart import batch_cross_entropy

    cfg = set_precision(load_config("configs/real/table/plan_path_mas_L1.yaml", ["warmstart.enabled=false"]),
                        lambda *a: None)
    torch.set_num_threads(2)
    policy = next(iter(build_state_checked(cfg).policies.values()))
    model = policy.model

    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(100, 40000, (900,), generator=g).tolist(),
              torch.randint(100, 40000, (100,), generator=g).tolist()) for _ in range(4)]
    times: dict[str, list[float]] = {"stock": [], "lean": []}
    for r in range(reps + 1):
        for name in ("stock", "lean"):
            restore(model) if name == "stock" else make_lean(model)
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            batch_cross_entropy(policy, pairs, budget)
            if r:
                times[name].append(time.perf_counter() - t)
    return {k: {"min": round(min(v), 2), "median": round(statistics.median(v), 2), "all": [round(x, 2) for x in v]}
            for k, v in times.items()}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4,
                          int(sys.argv[2]) if len(sys.argv) > 2 else 4096)))
