"""Where the warm start's resident peak comes from: the resident set sampled every 10 ms, labelled by what runs
(a micro-batch's forward, its backward, the optimizer step, between them).

    python benchmarks/warmstart_peak.py [CONFIG.yaml] [dotted.key=value ...]

Builds the run's policies as ``atgrpo train`` does, collects the warm start's demonstrations and runs its
fine-tuning (``trainer.warmstart.supervised_finetune``, one policy on every role's pairs, as ``warmstart.common``
does). Default: the Plan-Path table cell with 4 episodes, 2 threads. Prints the pairs' lengths, the seconds, and
the peak resident memory under each label (GiB). ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment makes the
resident set follow the live tensors (glibc then maps every block of 64 KiB or more afresh), at a cost in time.
"""

from __future__ import annotations

import sys
import threading
import time


def main(argv: list[str]) -> dict[str, float]:
    import atgrpo  # noqa: F401  (first: it sets torch's allocator up before torch allocates)
    import torch

    from atgrpo.cli import _split_args
    from atgrpo.config import load_config
    from atgrpo.trainer import warmstart
    from atgrpo.trainer.metrics import rss_mb
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked

    path, overrides = _split_args(argv)
    path = path or "configs/real/table/plan_path_mas_L1.yaml"
    cfg = set_precision(load_config(path, ["warmstart.episodes=4", "train.threads=2", *overrides]), lambda *a: None)
    torch.set_num_threads(max(1, cfg.train.threads))
    state = build_state_checked(cfg)
    label, peaks, done = ["setup"], {}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks[label[0]] = max(peaks.get(label[0], 0.0), rss_mb() / 1024)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    demos = warmstart.collect_demonstrations(state.make_env, state.agent_to_policy, state.policies, cfg.warmstart,
                                             cfg.seed)
    pairs = [pair for pid in sorted(demos) for pair in demos[pid]]
    print("pairs (prompt, answer tokens):", [(len(p), len(a)) for p, a in pairs])
    score, step = warmstart.shared_prefix_logprobs, torch.optim.AdamW.step

    def labelled_score(*a, **k):
        label[0] = "forward"
        out = score(*a, **k)
        label[0] = "backward"  # until the next forward or the optimizer step
        return out

    def labelled_step(self, *a, **k):
        label[0] = "optimizer step"
        out = step(self, *a, **k)
        label[0] = "between"
        return out

    warmstart.shared_prefix_logprobs, torch.optim.AdamW.step = labelled_score, labelled_step
    try:
        t = time.time()
        warmstart.supervised_finetune(state.policies[sorted(demos)[0]], pairs, cfg.warmstart, cfg.seed, False)
        seconds = time.time() - t
    finally:
        warmstart.shared_prefix_logprobs, torch.optim.AdamW.step = score, step
    time.sleep(0.05)
    done.set()
    print(f"{path}: warm start {seconds:.1f} s, resident after {rss_mb() / 1024:.2f} GiB")
    for name, gib in peaks.items():
        print(f"  {name:15s} peak {gib:.2f} GiB")
    return {"seconds": seconds, **peaks}


if __name__ == "__main__":
    main(sys.argv[1:])
