"""What the backward of one warm-start micro-batch keeps, per token and by autograd node, on a real config.

    python benchmarks/kept_bytes.py [CONFIG.yaml] [--prompt N] [--answer N] [--samples N] [--stock] [key=value ...]

Builds the run's policy as ``atgrpo train`` does (no warm start), runs the shared-prefix log-probs of ``samples``
random prompts and answers (the warm start's and the update's forward), and prints the bytes its autograd graph
saved (``trainer.memory.saved_tensor_bytes``: distinct storages, parameters excluded), in total, per token and by
(node, dtype). Default: the Plan-Path table cell, 4 samples of 900 + 100 tokens. ``--stock``: with transformers'
own norms and MLPs (``policies/lean_layers.py`` undone), what the backward kept before.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> None:
    import torch

    from atgrpo.cli import _split_args
    from atgrpo.config import load_config
    from atgrpo.policies.shared_prefix import shared_prefix_logprobs
    from atgrpo.trainer.memory import saved_tensor_bytes
    from atgrpo.trainer.run_settings import set_precision
    from atgrpo.trainer.state import build_state_checked

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=900)
    ap.add_argument("--answer", type=int, default=100)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--stock", action="store_true")
    args, rest = ap.parse_known_args(argv)
    path, overrides = _split_args(rest or ["configs/real/table/plan_path_mas_L1.yaml"])
    cfg = set_precision(load_config(path, overrides + ["warmstart.enabled=false"]), lambda *a: None)
    torch.set_num_threads(max(1, cfg.train.threads))
    policy = next(iter(build_state_checked(cfg).policies.values()))
    policy.model.train()  # as the warm start and the update run it
    if args.stock:
        from atgrpo.policies.lean_layers import restore

        restore(policy.model)
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    prompts = [torch.randint(100, vocab, (args.prompt,), generator=g).tolist() for _ in range(args.samples)]
    answers = [torch.randint(100, vocab, (args.answer,), generator=g).tolist() for _ in range(args.samples)]
    logp, mask = shared_prefix_logprobs(policy, prompts, answers, 1.0)
    kept = saved_tensor_bytes(-(logp * mask).sum())
    tokens = args.samples * (args.prompt + args.answer)
    total = sum(kept.values())
    what = " (stock norms and MLPs)" if args.stock else ""
    print(f"{path}{what}: {cfg.model.precision} on {cfg.model.dtype} weights, {tokens} tokens: kept "
          f"{total / 2**20:.0f} MiB, {total / tokens / 1024:.1f} KiB per token")
    for (node, dtype), b in sorted(kept.items(), key=lambda kv: -kv[1]):
        print(f"  {b / 2**20:8.1f} MiB  {b / tokens / 1024:7.2f} KiB/token  {node} ({dtype})")


if __name__ == "__main__":
    main(sys.argv[1:])
