"""Decoding through the model's own forward: the engine for models the native decoder does not run (other
architectures, LoRA adapters), and the reference the native decoder is tested against.

Each prompt is prefilled once; its ``n`` branches then decode with cascade attention (``policies/cascade.py``:
the prompt's keys/values stay one copy, read once per step for all its branches) or, on architectures where that
is not known to be exact, from a K-way expanded cache with the whole length reserved (``policies/kv_cache.py``:
decode steps write in place). Rows that have emitted EOS are dropped at once. The uniform numbers are those of
``native_generate`` (``sampling.draw_uniforms``), so both give the same tokens for the same logits.
"""

from __future__ import annotations

import contextlib

import torch

from ..policies.cascade import active
from ..policies.kv_cache import CascadeCache, ReservedCache
from .sampling import draw_uniforms, next_tokens


@torch.no_grad()
def reference_generate(policy, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``native.native_generate`` returns, computed with the model's forward at every step."""
    model, dev = policy.model, policy.device
    B, T = len(prompt_ids), max_new_tokens
    input_ids, attn = policy.pad_prompts(prompt_ids, left=True)  # every prompt ends at column Lp - 1
    Lp = input_ids.shape[1]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, Lp)
    shared = policy.cascade and n > 1  # each prompt's keys one copy, read once per step for its n branches
    cache = CascadeCache(attn, T) if shared else ReservedCache(Lp + T)
    last_only = {"logits_to_keep": 1} if policy.takes_logits_to_keep else {}
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                **{policy.cache_arg: cache}, **last_only)
    logits = out.logits[:, -1].float().repeat_interleave(n, 0)  # (R, V), R = B * n
    cache.batch_repeat_interleave(n)
    attn = attn.repeat_interleave(n, 0)
    next_pos = pos[:, -1].repeat_interleave(n, 0) + 1  # (R,)
    R = B * n
    u = draw_uniforms(T, R, generator, dev) if temperature > 0 else None
    rows = torch.arange(R, device=dev)  # which output row each live cache row belongs to
    out_tok = torch.full((R, T), -1, dtype=torch.long, device=dev)  # -1: not generated
    out_lp = torch.zeros((R, T), device=dev)
    with active(model, cache) if shared else contextlib.nullcontext():
        for step in range(T):
            tok, lp = next_tokens(logits, temperature, None if u is None else u[step, rows])
            out_tok[rows, step] = tok
            if lp is not None:
                out_lp[rows, step] = lp
            finished = tok == policy.eos_id
            if step == T - 1 or bool(finished.all()):
                break
            if bool(finished.any()):  # drop finished rows: they stop costing compute
                keep = (~finished).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                        use_cache=True, **{policy.cache_arg: cache})
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1
    return out_tok, out_lp
