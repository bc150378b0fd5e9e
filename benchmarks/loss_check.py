"""Is a step's loss on an accelerator (or under bfloat16 autocast) the CPU float32 loss on the same samples?

Samples a batch on the CPU in float32 (chat prompts of about 300 tokens, K responses each, temperature 1), then
scores it twice: the CPU float32 model (the reference) and a copy on ``--device`` under ``--autocast``. Prints
the per-token log-prob differences, the AT-GRPO loss of each (the same random advantages), and how their
gradients compare (relative norm difference, cosine). Run by ``benchmarks/gpu_check.sh`` on a GPU; on a CPU-only
machine ``--device cpu --autocast bfloat16`` checks CPU autocast against float32 the same way.

    python benchmarks/loss_check.py --model smollm2-135m --device cuda --autocast bfloat16
    python benchmarks/loss_check.py --model tiny --device cpu --autocast bfloat16   # seconds, no download
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from atgrpo.algorithms.losses import policy_loss
from atgrpo.bench.common import Shape, bench_prompts, make_policy
from atgrpo.config import AlgoConfig
from atgrpo.policies.precision import apply_autocast
from atgrpo.trainer.update import score


def _loss_and_grad(policy, samples, old, adv, algo):
    """The batch's token-mean loss, per-token log-probs and flat gradient (float32 on the CPU)."""
    policy.model.zero_grad(set_to_none=True)
    logp, mask = score(policy, samples, 1.0, algo)
    loss, _ = policy_loss(logp, old.to(logp.device), adv.to(logp.device), mask, aggregation="token-mean")
    loss.backward()
    # float64: sums over 10^8 float32 terms lose digits (a float32 cosine came out at 1.03)
    grad = torch.cat([p.grad.double().flatten().cpu() for p in policy.model.parameters() if p.grad is not None])
    return float(loss.detach()), logp.detach().float().cpu(), mask.cpu(), grad


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="tiny | a preset (smollm2-135m) | a local HF directory")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--autocast", default="bfloat16", choices=["none", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    shape = Shape(prompts=args.prompts, prompt_len=(300, 300), K=args.K, model=args.model)
    ref = make_policy(shape)
    texts = bench_prompts(shape, ref)
    prompts = [ref.encode(t) for t in texts]
    comps = ref.generate(prompts, args.K, 1.0, args.new_tokens, generator=torch.Generator().manual_seed(0))

    class S:  # the fields ``score`` reads
        def __init__(self, p, c):
            self.prompt_ids, self.response_ids, self.temperature = p, c.ids, None

    samples = [S(p, c) for p, row in zip(prompts, comps) for c in row]
    T = max(len(s.response_ids) for s in samples)
    old = torch.zeros(len(samples), T)
    for i, c in enumerate(c for row in comps for c in row):
        old[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(1))
    algo = AlgoConfig(shared_prefix=True, update_token_budget=16384, micro_batch_size=256)

    other = copy.deepcopy(ref)  # the same weights, moved, under autocast
    other.model = apply_autocast(other.model.to(args.device), args.autocast)
    other.device = args.device
    loss_ref, lp_ref, mask, g_ref = _loss_and_grad(ref, samples, old, adv, algo)
    loss_dev, lp_dev, _, g_dev = _loss_and_grad(other, samples, old, adv, algo)
    d = (lp_dev - lp_ref).abs()[mask.bool()]
    out = {"model": args.model, "device": args.device, "autocast": args.autocast, "samples": len(samples),
           "tokens": int(mask.sum()), "loss_cpu_float32": loss_ref, "loss_device": loss_dev,
           "loss_abs_diff": abs(loss_dev - loss_ref),
           "logprob_abs_diff_max": float(d.max()), "logprob_abs_diff_mean": float(d.mean()),
           "grad_rel_diff": float((g_dev - g_ref).norm() / g_ref.norm()),
           "grad_cosine": float(torch.nn.functional.cosine_similarity(g_dev, g_ref, dim=0))}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
