"""What the LM head and its log-probs cost, old way against new, interleaved in one run (SmolLM2-135M's shapes by
default: 49,152-token vocabulary, hidden size 576).

- **loss**: the log-probs of a micro-batch's response tokens, forward and backward from the logits
  (``--positions`` of them): the autograd-built chunked log-sum-exp atgrpo used before (chunk slices, ``gather``,
  ``logsumexp``: each slice's and gather's backward zero-fills a logits-sized gradient) against
  ``policies.logprobs.token_logprobs`` (its softmax kept, a one-pass backward).
- **copy head**: one decoding step's logits on the bfloat16 rollout copy (``--rows`` rows): the float32 head (the
  trainer's) against ``rollout_copy._topk_exact_head`` (bfloat16 head, each row's ``EXACT_TOP`` highest logits
  recomputed in float32), with the largest difference of the two at those top logits and over all.

    python benchmarks/head_cost.py [--positions 505] [--rows 64] [--threads 2] [--reps 10]
"""

from __future__ import annotations

import argparse
import statistics
import types

import torch
import torch.nn.functional as F

from atgrpo.bench.common import interleaved
from atgrpo.policies.logprobs import LOGPROB_CHUNK_ROWS, token_logprobs
from atgrpo.policies.rollout_copy import EXACT_TOP, _cast_head, _topk_exact_head


def autograd_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-probs as autograd's pieces compute them (atgrpo's loss before ``token_logprobs``), T = 1."""
    out = []
    for s in range(0, logits.shape[0], LOGPROB_CHUNK_ROWS):
        x = logits[s:s + LOGPROB_CHUNK_ROWS].float()
        out.append(x.gather(1, targets[s:s + LOGPROB_CHUNK_ROWS, None]).squeeze(1) - torch.logsumexp(x, dim=-1))
    return torch.cat(out)


def medians(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each function over ``reps`` interleaved repetitions, one warm-up round first."""
    return {k: statistics.median(v) for k, v in interleaved(fns, reps, warmup=1).items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=505, help="logit rows of one loss micro-batch")
    ap.add_argument("--rows", type=int, default=64, help="rows of one decoding step")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(args.positions, args.vocab, generator=g)).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g)
    w = torch.randn(args.positions, generator=g)

    def loss(fn):
        def run():
            logits.grad = None
            (fn(logits, targets) * w).sum().backward()
        return run

    loss_s = medians({"autograd": loss(autograd_logprobs),
                          "token_logprobs": loss(lambda x, t: token_logprobs(x, t, 1.0))}, args.reps)

    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    with torch.no_grad():
        head.weight.normal_(0, 0.05, generator=g)
    h = 8 * torch.randn(args.rows, 1, args.hidden, generator=g)
    _cast_head(head, torch.bfloat16)
    topk = types.MethodType(_topk_exact_head, head)
    with torch.no_grad():
        exact, mixed = F.linear(h, head.weight), topk(h)
        head_s = medians({"float32": lambda: F.linear(h, head.weight), "topk_exact": lambda: topk(h)}, args.reps)
    top = exact.topk(EXACT_TOP // 2, dim=-1).indices
    out = {"threads": args.threads, "vocab": args.vocab,
           "loss": {"positions": args.positions, **loss_s, "speedup": loss_s["autograd"] / loss_s["token_logprobs"]},
           "copy_head": {"rows": args.rows, "exact_top": EXACT_TOP, **head_s,
                         "speedup": head_s["float32"] / head_s["topk_exact"],
                         "max_diff_top": float((mixed.gather(-1, top) - exact.gather(-1, top)).abs().max()),
                         "max_diff_all": float((mixed - exact).abs().max())}}
    print(f"loss log-probs, {args.positions} positions x {args.vocab}, forward + backward, {args.threads} threads: "
          f"autograd-built {loss_s['autograd'] * 1e3:.0f} ms, token_logprobs {loss_s['token_logprobs'] * 1e3:.0f} ms "
          f"({out['loss']['speedup']:.2f}x)")
    c = out["copy_head"]
    print(f"copy's head, {args.rows} rows: float32 {head_s['float32'] * 1e3:.1f} ms, bfloat16 + top-{EXACT_TOP} exact "
          f"{head_s['topk_exact'] * 1e3:.1f} ms ({c['speedup']:.2f}x); largest difference at the top logits "
          f"{c['max_diff_top']:.1e}, over all {c['max_diff_all']:.1e}")
    return out


if __name__ == "__main__":
    main()
