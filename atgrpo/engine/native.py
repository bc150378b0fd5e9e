"""The native engine: ``n`` branches per prompt, prefilled once, decoded together with ``decoder.Decoder``.

One call, ``native_generate``, does what AT-GRPO's tree needs at a node: the distinct prompts are prefilled once
in one batch with the model's own forward (their keys/values kept one copy per prompt), then all ``B * n``
branches decode together, each step one ``Decoder.step`` and one draw per row (``sampling.next_tokens``, with
uniform numbers drawn up front: the tokens do not depend on when finished rows are dropped).

Finished rows (EOS) stop costing compute when they are dropped from the batch. Dropping copies the live rows'
keys/values, and its test of which rows finished reads the device, so it is done at scheduled points: every
``compact_every`` steps (1 on the CPU, where reading a flag costs nothing; more on an accelerator, where it stalls
the queue and breaks a captured graph's replay), and only when at least one row in ``COMPACT_FRACTION`` has
finished since the last drop, or when every row has. Between two points a finished row decodes on, its tokens
discarded.
"""

from __future__ import annotations

import torch

from .decoder import Decoder, part
from .graphs import StepGraphs, graphs_available
from .sampling import draw_uniforms, next_tokens

COMPACT_FRACTION = 8  # drop finished rows once at least 1 / COMPACT_FRACTION of the live rows has finished


def compact_every_default(device) -> int:
    return 1 if torch.device(device).type == "cpu" else 16


@torch.no_grad()
def native_generate(policy, decoder: Decoder, prompt_ids: list[list[int]], n: int, temperature: float,
                    max_new_tokens: int, generator: torch.Generator | None = None, compact_every: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens ``(B * n, max_new_tokens)`` (-1 after a row's EOS and where nothing was generated) and their
    log-probs (0 where none), rows prompt-major (row ``i * n + k``: branch k of prompt i). ``policy`` gives the
    padding, the device, the EOS id and whether to replay captured steps on CUDA (``cuda_graphs``: see
    ``graphs.py``); ``compact_every``: steps between the points where finished rows may be dropped (default: 1 on
    the CPU, 16 elsewhere)."""
    dev, eos = policy.device, policy.eos_id
    B, T = len(prompt_ids), max_new_tokens
    R = B * n
    logits, keys, values, mask = decoder.prefill(prompt_ids, dev)
    logits = logits.repeat_interleave(n, 0)  # (R, V)
    st = decoder.new_state(keys, values, mask, R, T)
    del keys, values
    st.expand(n)
    graphs = StepGraphs(decoder, st) if getattr(policy, "cuda_graphs", False) and graphs_available(dev) else None
    next_pos = torch.tensor([len(p) for p in prompt_ids], device=dev).repeat_interleave(n, 0)  # (R,)
    u = draw_uniforms(T, R, generator, dev) if temperature > 0 else None
    rows = torch.arange(R, device=dev)  # the output row of each live row
    done = torch.zeros(R, dtype=torch.bool, device=dev)  # live rows that have emitted EOS
    out_tok = torch.full((R, T), -1, dtype=torch.long, device=dev)
    out_lp = torch.zeros((R, T), device=dev)
    every = compact_every or compact_every_default(dev)
    for step in range(T):
        with part("sampling"):
            tok, lp = next_tokens(logits, temperature, None if u is None else u[step, rows])
        with part("bookkeeping"):
            out_tok[rows, step] = torch.where(done, -1, tok)
            if lp is not None:
                out_lp[rows, step] = torch.where(done, 0.0, lp)
            done = done | (tok == eos)
        if step == T - 1:
            break
        if (step + 1) % every == 0:
            with part("bookkeeping"):
                n_done = int(done.sum())
                if n_done == len(done):
                    break
                if n_done * COMPACT_FRACTION >= len(done):
                    keep = (~done).nonzero().squeeze(1)
                    st.keep(keep)
                    rows, tok, next_pos, done = rows[keep], tok[keep], next_pos[keep], done[keep]
        if graphs is not None:
            logits = graphs.step(st, tok, next_pos)
        else:
            logits = decoder.step(st, tok, next_pos)
        next_pos = next_pos + 1
    return out_tok, out_lp
