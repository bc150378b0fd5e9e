"""The fused LM head's forward and backward (``policies.logprobs.head_logprobs``) at several vocabulary block
sizes of its backward (``HEAD_VOCAB_BLOCK``; one block as large as the vocabulary is the unblocked backward),
interleaved in one process, under bfloat16 autocast on float32 weights as training runs it.

    python benchmarks/head_blocks.py [--positions 1106] [--vocab 49152] [--hidden 576] [--reps 4] [BLOCK ...]

Default blocks: 49152 (unblocked) and 8192 (the default). Prints each block's median seconds over ``reps`` timed
rounds (after one untimed round). SmolLM2-135M's head shapes by default; 2 threads.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types


def main() -> None:
    import atgrpo  # noqa: F401  (first: it sets torch's allocator up before torch allocates)
    import torch

    from atgrpo.policies import logprobs

    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=1106)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("blocks", type=int, nargs="*", default=[49152, 8192])
    args = ap.parse_args()
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    head = types.SimpleNamespace(weight=torch.nn.Parameter(torch.randn(args.vocab, args.hidden, generator=g) * 0.02),
                                 bias=None)
    hidden = torch.randn(args.positions, args.hidden, generator=g).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g)
    seconds: dict[int, list[float]] = {b: [] for b in args.blocks}
    for rep in range(args.reps + 1):
        for block in args.blocks:
            logprobs.HEAD_VOCAB_BLOCK = block
            head.weight.grad = hidden.grad = None
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = logprobs.head_logprobs(hidden, head, targets, 1.0, grad_dtype=torch.bfloat16)
            out.sum().backward()
            if rep:
                seconds[block].append(time.perf_counter() - t)
    for block, s in seconds.items():
        print(f"vocabulary block {block:6d}: median {statistics.median(s):.3f} s  ({', '.join(f'{x:.3f}' for x in s)})")


if __name__ == "__main__":
    main()
