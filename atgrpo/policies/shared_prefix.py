"""Shared-prefix scoring: each distinct prompt runs forward once, its KV cache feeds all responses to it.

An AT-GRPO group is K responses to one identical prompt. Scoring them one by one (``response_logprobs``) runs
the prompt K times; here the prompt runs once, with gradients, and the K responses run on top of its keys/values.
On Llama / Qwen2 / Qwen3 full-attention models the responses attend the one copy of the prompt's keys/values
with cascade attention (``cascade.py``: the K responses' queries stacked against it, merged exactly with their
own causal part); elsewhere the keys/values are repeated K ways along the batch (``expand``, inside a cache layer
that joins them to the responses' own keys). Either way autograd sums the K members' gradients back into the one
prompt pass, so logp, loss and parameter gradients equal those of K separate forwards (up to float rounding).
Linear-layer work drops from ``K * (P + T)`` to ``P + K * T`` tokens per group; cascade attention also reads
(and back-propagates into) each prompt's keys once instead of K times.

Samples are grouped by their ``prompt_ids`` (not by group key), so any grouping key benefits whenever prompts
repeat; a prompt seen once is simply a group of one. ``plan_chunks`` packs whole prompt groups into
micro-batches under a padded-token budget, sorted by length so padding stays small; ``shared_prefix_logprobs``
scores one micro-batch. Prompts are left-padded (all end at the same column, like ``generate``), responses
right-padded; position ids count real tokens only, so padding changes nothing.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from . import cascade
from .cascade import CascadeCache
from .causal_lm import CausalLMPolicy


def group_by_prompt(prompt_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices of the samples that share an identical prompt, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(tuple(p), []).append(i)
    return list(groups.values())


def chunk_cost(prompt_lens: Sequence[int], response_lens: Sequence[Sequence[int]]) -> int:
    """Padded tokens one forward over these groups runs: G * max prompt + R * (max response - 1)."""
    if not prompt_lens:
        return 0
    rows = sum(len(r) for r in response_lens)
    t_max = max((t for r in response_lens for t in r), default=1)
    return len(prompt_lens) * max(prompt_lens) + rows * max(t_max - 1, 0)


def plan_chunks(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], token_budget: int,
                max_rows: int | None = None) -> list[list[int]]:
    """Split samples into micro-batches of whole prompt groups, each within ``token_budget`` padded tokens
    (``chunk_cost``) and ``max_rows`` responses. Groups are sorted by (prompt length, longest response) so
    that neighbours pad little. A group too big on its own is split into sub-groups of members (each runs
    the prompt again: still exact). Returns lists of sample indices covering every sample once."""
    max_rows = max_rows or len(prompt_ids) or 1
    units: list[list[int]] = []
    for g in group_by_prompt(prompt_ids):
        lp = len(prompt_ids[g[0]])
        per = max(1, min(max_rows, (token_budget - lp) // max(1, max(len(response_ids[i]) for i in g) - 1)))
        units += [g[s:s + per] for s in range(0, len(g), per)]
    units.sort(key=lambda u: (len(prompt_ids[u[0]]), max(len(response_ids[i]) for i in u)))
    chunks: list[list[int]] = []
    cur: list[list[int]] = []
    for u in units:
        trial = cur + [u]
        cost = chunk_cost([len(prompt_ids[v[0]]) for v in trial], [[len(response_ids[i]) for i in v] for v in trial])
        if cur and (cost > token_budget or sum(map(len, trial)) > max_rows):
            chunks.append([i for v in cur for i in v])
            trial = [u]
        cur = trial
    if cur:
        chunks.append([i for v in cur for i in v])
    return chunks


class _PrefixLayer(DynamicLayer):
    """One layer's prompt keys/values, one row per group ``(G, H, Lp, D)``. Its single ``update`` (the response
    pass) returns them repeated ``sizes[j]`` times per group, joined with the responses' own ``(R, H, T, D)``.
    Repetition goes through ``expand`` (a view: its backward is a plain sum over the copies; a gather's,
    scatter-add, is several times slower on CPU), and for equal group sizes the join is the only copy."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, sizes: list[int]):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.sizes = keys, values, sizes

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values = _join(self.keys, key_states, self.sizes), _join(self.values, value_states, self.sizes)
        return self.keys, self.values


def _join(prefix: torch.Tensor, new: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """prefix  # (G, H, Lp, D), new  # (R, H, T, D) -> (R, H, Lp + T, D): group j's prefix for each of its rows."""
    G, H, Lp, D = prefix.shape
    if len(set(sizes)) == 1:
        K = sizes[0]
        joined = torch.cat([prefix[:, None].expand(G, K, H, Lp, D), new.view(G, K, H, -1, D)], dim=3)
        return joined.view(G * K, H, -1, D)
    rows = torch.cat([prefix[j:j + 1].expand(n, H, Lp, D) for j, n in enumerate(sizes)], dim=0)
    return torch.cat([rows, new], dim=2)


def shared_prefix_logprobs(policy: CausalLMPolicy, prompt_ids: Sequence[Sequence[int]],
                           response_ids: Sequence[Sequence[int]], temperature: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(response tokens | prompt) under softmax(logits / T), with gradients; same contract as
    ``CausalLMPolicy.response_logprobs``: ``logp  # (B, T)``, ``mask  # (B, T)`` in input order, T = the
    longest response, rows right-padded. One forward over the distinct prompts, one over the responses."""
    B, dev, model = len(prompt_ids), policy.device, policy.model
    T = max((len(r) for r in response_ids), default=0)
    if B == 0 or T == 0:
        z = torch.zeros((B, T), device=dev)
        return z, z.clone()
    groups = group_by_prompt(prompt_ids)
    G = len(groups)
    plens = torch.tensor([len(prompt_ids[g[0]]) for g in groups])  # (G,)
    Lp = int(plens.max())
    pin = torch.full((G, Lp), policy.pad_id, dtype=torch.long)
    pattn = torch.zeros((G, Lp), dtype=torch.long)
    for j, g in enumerate(groups):  # left padding: every prompt ends at column Lp - 1
        pin[j, Lp - len(prompt_ids[g[0]]):] = torch.tensor(list(prompt_ids[g[0]]))
        pattn[j, Lp - len(prompt_ids[g[0]]):] = 1
    pin, pattn = pin.to(dev), pattn.to(dev)
    ppos = (pattn.cumsum(-1) - 1).clamp(min=0)  # (G, Lp)
    # cascade: the responses attend each prompt's one copy of keys/values (cascade.py); else K expanded copies
    cache = CascadeCache(pattn, T - 1) if policy.cascade else DynamicCache()
    out = model(input_ids=pin, attention_mask=pattn, position_ids=ppos, use_cache=True, logits_to_keep=1,
                **{policy._cache_kw: cache})
    order = [i for g in groups for i in g]  # response row r holds sample order[r]
    row_group = torch.tensor([j for j, g in enumerate(groups) for _ in g], device=dev)  # (R,)
    first = out.logits[:, -1][row_group]  # (R, V): predicts response token 0
    if T > 1:
        if policy.cascade:
            cache.set_rows(row_group)
            attending = cascade.active(model, cache)
        else:
            sizes = [len(g) for g in groups]
            cache = Cache(layers=[_PrefixLayer(layer.keys, layer.values, sizes) for layer in cache.layers])
            attending = contextlib.nullcontext()
        rin = torch.full((B, T - 1), policy.pad_id, dtype=torch.long)
        rattn = torch.zeros((B, T - 1), dtype=torch.long)
        for r, i in enumerate(order):
            n = len(response_ids[i]) - 1
            if n > 0:
                rin[r, :n] = torch.tensor(list(response_ids[i][:n]))
                rattn[r, :n] = 1
        rin, rattn = rin.to(dev), rattn.to(dev)
        attn = torch.cat([pattn[row_group], rattn], dim=1)  # (R, Lp + T - 1)
        rpos = plens.to(dev)[row_group][:, None] + torch.arange(T - 1, device=dev)  # (R, T - 1)
        with attending:
            out = model(input_ids=rin, attention_mask=attn, position_ids=rpos, use_cache=True,
                        **{policy._cache_kw: cache})
        logits = torch.cat([first[:, None], out.logits], dim=1)  # (R, T, V)
    else:
        logits = first[:, None]  # (R, 1, V)
    logp_all = F.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    targets = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for r, i in enumerate(order):
        targets[r, :len(response_ids[i])] = torch.tensor(list(response_ids[i]), dtype=torch.long)
        mask[r, :len(response_ids[i])] = 1
    targets, mask = targets.to(dev), mask.to(dev)
    logp = logp_all.gather(2, targets[:, :, None]).squeeze(2) * mask  # (R, T), rows in `order`
    inv = torch.empty(B, dtype=torch.long)
    inv[torch.tensor(order)] = torch.arange(B)
    inv = inv.to(dev)
    return logp[inv], mask[inv]
