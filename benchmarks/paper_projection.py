"""A projection, not a measurement: one AT-GRPO step's time at the paper's shapes on this CPU, from measured rates.

    python benchmarks/paper_projection.py [--nodes 8] [--problems 32] [-K 8] [--prompt 4096] [--new 2048]

Why: the paper trains Qwen3-1.7B / 8B with K = 8, prompts up to 4096 tokens, 2048 new tokens, 32 problems per step;
nothing that size runs on a 2-core CPU, but the measured rates and growth exponents say what it would cost.
Two estimates per model and precision, from the same measured SmolLM2-135M reference (1 node: 8 problems, 300-token
prompts, K = 8, 64 new tokens; ``docs/results/precision/{rollout,update}_smollm2_zen5.json``, 2 threads):

- **FLOPs** (N = turns x agents nodes, B problems, prompt P, T new tokens; n parameters, L layers, d hidden; every
  prompt at its cap P, every response T tokens; attention 4 L d FLOPs per (query, key) forward, 12 L d forward +
  backward, as ``bench.update.model_flops`` counts it)::

      rollout FLOPs = N B [2 n (P + K T) + 4 L d (P^2 / 2 + K (T P + T^2 / 2))]    tree: each prompt prefilled once
      update FLOPs  = N B [6 n (P + K T) + 12 L d (P^2 / 2 + K (T P + T^2 / 2))]   shared prefix: once per group
      seconds = FLOPs / rate;   rate = the reference's model FLOPs / its median seconds (tree sampler; shared-prefix
                                update), in the precision named

  The prompt term counts once per node and group, not K times, because that is what the measured exponents in K
  say (``docs/results/scale/tiny``: tree 0.24, shared prefix 0.43, against 1.02 / 0.97 for per-branch requests and
  per-sample scoring); turns and agents (``tiny_teams``, 1.2-1.5) say a step is linear in nodes plus the growth of
  their prompts, which taking every prompt at its cap bounds.
- **Power law**: seconds = reference seconds x (n / n_ref) x (B / 8)^e_problems x (P / 300)^e_prompt x (T / 64)
  x N^e_turns, with each phase's exponents from the tiny preset's scale runs (new tokens are not an axis: linear,
  one decoding step per token, assumed). It extrapolates a tiny model's curves far outside their range, so it is
  the cruder of the two; the gap between them is a measure of how little either should be trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")


def load(*parts: str) -> dict:
    with open(os.path.join(RESULTS, *parts)) as f:
        return json.load(f)


def flops(n: int, layers: int, hidden: int, B: int, N: int, K: int, P: int, T: int) -> tuple[float, float]:
    """(rollout, update) model FLOPs of one step, as the module docstring's formula."""
    attn_pairs = P * P / 2 + K * (T * P + T * T / 2)
    per_group = (2 * n * (P + K * T) + 4 * layers * hidden * attn_pairs,
                 6 * n * (P + K * T) + 12 * layers * hidden * attn_pairs)
    return N * B * per_group[0], N * B * per_group[1]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8, help="turns x agents (the math recipe: 4 turns x 2 agents)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("-K", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--new", type=int, default=2048)
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from atgrpo.model_shapes import BUILTIN_SHAPES, num_params

    roll, upd = load("precision", "rollout_smollm2_zen5.json"), load("precision", "update_smollm2_zen5.json")
    ref = roll["shape"]
    n_ref = roll["params"]
    rates = {"float32": (roll["methods"]["tree"], upd["methods"]["shared_prefix"]),
             "bfloat16": (roll["methods"]["tree_bf16_copy"], upd["methods"]["shared_prefix_bf16"])}
    node_axes = load("scale", "tiny", "scale.json")["axes"]
    turns = load("scale", "tiny_teams", "scale.json")["axes"]["turns"]["slopes"]
    exps = {phase: {"problems": node_axes["problems"]["slopes"][m], "prompt": node_axes["prompt"]["slopes"][m],
                    "nodes": turns[m]}
            for phase, m in (("rollout", "rollout_tree"), ("update", "update_shared_prefix"))}
    print(f"PROJECTION, not a measurement: {a.nodes} nodes x {a.problems} problems, K = {a.K}, prompt {a.prompt} + "
          f"{a.new} new tokens; reference SmolLM2-135M, {ref['prompts']} problems x {ref['prompt_len'][0]} tokens, "
          f"K = {ref['K']}, {ref['new_tokens']} new tokens, 1 node ({roll['machine']['cpu_model']}, "
          f"{roll['machine']['torch_threads']} threads); exponents {json.dumps(exps)}")
    print("\n| model | precision | measured rate rollout / update (GFLOP/s) | rollout TFLOP | update TFLOP | "
          "FLOPs: rollout + update = step | power law: rollout + update = step |\n|---|---|---|---|---|---|---|")
    for key in ("qwen3-1.7b", "qwen3-8b"):
        s = BUILTIN_SHAPES[key]
        n = num_params(s)
        f_roll, f_upd = flops(n, s.layers, s.hidden, a.problems, a.nodes, a.K, a.prompt, a.new)
        for precision, (r, u) in rates.items():
            rate_r, rate_u = r["model_flops"] / r["median_s"], u["model_flops"] / u["median_s"]
            t_roll, t_upd = f_roll / rate_r, f_upd / rate_u
            power = []
            for phase, ref_s in (("rollout", r["median_s"]), ("update", u["median_s"])):
                e = exps[phase]
                power.append(ref_s * n / n_ref * (a.problems / ref["prompts"]) ** e["problems"]
                             * (a.prompt / ref["prompt_len"][0]) ** e["prompt"] * (a.new / ref["new_tokens"])
                             * a.nodes ** e["nodes"])
            print(f"| {s.name} ({n / 1e9:.2f}B) | {precision} | {rate_r / 1e9:.0f} / {rate_u / 1e9:.0f} | "
                  f"{f_roll / 1e12:,.0f} | {f_upd / 1e12:,.0f} | {_days(t_roll)} + {_days(t_upd)} = "
                  f"**{_days(t_roll + t_upd)}** | {_days(power[0])} + {_days(power[1])} = {_days(sum(power))} |")


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} d" if seconds >= 86400 else f"{seconds / 3600:.1f} h"


if __name__ == "__main__":
    main(sys.argv[1:])
