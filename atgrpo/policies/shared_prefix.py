"""Shared-prefix scoring: each distinct prompt runs forward once, and the K responses to it run on its keys/values.

An AT-GRPO group is K responses to one identical prompt. Scoring them one by one (``response_logprobs``) runs
the prompt K times; here it runs once, with gradients. On Llama / Qwen2 / Qwen3 full-attention models a
micro-batch is one forward over a packed prefix tree (``_tree_logits``): the distinct prompts' tokens
(right-padded), then the responses' tokens, in one sequence; the prompts attend themselves causally and each
response attends its prompt's one copy of keys/values and itself (``cascade.PrefixTree``, cascade attention).
Elsewhere (``_two_pass_logits``) the prompts run first (left-padded, like ``generate``) and the responses then run
on their keys/values repeated K ways along the batch (``expand``, inside a cache layer that joins them to the
responses' own keys). Either way autograd sums the K members' gradients back into the one prompt pass, so logp,
loss and parameter gradients equal those of K separate forwards (up to float rounding;
``tests/test_shared_prefix.py``). Linear-layer work drops from ``K * (P + T)`` to ``P + K * T`` tokens per
group; cascade attention also reads (and back-propagates into) each prompt's keys once instead of K times.

Samples are grouped by their ``prompt_ids`` (not by group key), so any grouping key benefits whenever prompts
repeat; a prompt seen once is simply a group of one. ``plan_chunks`` packs whole prompt groups into
micro-batches under a padded-token budget, sorted by length so padding stays small; ``shared_prefix_logprobs``
scores one micro-batch. Responses are right-padded; position ids count real tokens only, so padding changes
nothing. With gradient checkpointing the prefix tree is part of each recomputed layer forward
(``cascade.enable_checkpointing``); the two-pass path cannot be checkpointed (its prompt cache is dropped) and says so.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from . import cascade
from .cascade import PrefixTree
from .logprobs import model_logprobs, token_logprobs
from .protocol import TrainablePolicy


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


def shared_prefix_logprobs(policy: TrainablePolicy, prompt_ids: Sequence[Sequence[int]],
                           response_ids: Sequence[Sequence[int]], temperature: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(response tokens | prompt) under softmax(logits / T), with gradients; same contract as
    ``TrainablePolicy.response_logprobs``: ``logp  # (B, T)``, ``mask  # (B, T)`` in input order, T = the
    longest response, rows right-padded. Each distinct prompt runs once."""
    B, dev = len(prompt_ids), policy.device
    T = max((len(r) for r in response_ids), default=0)
    if B == 0 or T == 0:
        z = torch.zeros((B, T), device=dev)
        return z, z.clone()
    groups = group_by_prompt(prompt_ids)
    order = [i for g in groups for i in g]  # response row r holds sample order[r]
    row_group = torch.tensor([j for j, g in enumerate(groups) for _ in g], device=dev)  # (R,)
    rin = torch.full((B, T - 1), policy.pad_id, dtype=torch.long)  # response tokens that predict the next one
    for r, i in enumerate(order):
        rin[r, :len(response_ids[i]) - 1] = torch.tensor(list(response_ids[i][:-1]), dtype=torch.long)
    prompts = [list(prompt_ids[g[0]]) for g in groups]
    targets = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for r, i in enumerate(order):
        targets[r, :len(response_ids[i])] = torch.tensor(list(response_ids[i]), dtype=torch.long)
        mask[r, :len(response_ids[i])] = 1
    targets, mask = targets.to(dev), mask.to(dev)
    if not policy.cascade and _checkpointing(policy.model) and torch.is_grad_enabled():
        raise ValueError("algo.shared_prefix=true with model.gradient_checkpointing=true needs an architecture with "
                         "prefix-tree attention (Llama, Qwen2, Qwen3): this model's two-pass scoring keeps the "
                         "prompts' keys in a cache, which checkpointed layers drop; set algo.shared_prefix=false")
    # token 0 is predicted from its prompt's last position, token t > 0 from the response's input t - 1
    if policy.cascade:
        own = len(groups) + (T - 1) * torch.arange(B, device=dev)[:, None] + torch.arange(T - 1, device=dev)
        # the positions (G + R * (T - 1)) that predict response tokens; the LM head fused into the log-probs
        logp = model_logprobs(policy.model, lambda: _tree_logits(policy, prompts, row_group, rin.to(dev)),
                              targets, temperature, rows=torch.cat([row_group[:, None], own], dim=1))
    else:
        first, rest = _two_pass_logits(policy, prompts, row_group, rin.to(dev))
        logp = torch.cat([token_logprobs(first, targets[:, :1], temperature, rows=row_group[:, None]),
                          token_logprobs(rest, targets[:, 1:], temperature)], dim=1)
    logp = logp * mask  # (R, T)
    inv = torch.empty(B, dtype=torch.long)
    inv[torch.tensor(order)] = torch.arange(B)
    inv = inv.to(dev)
    return logp[inv], mask[inv]


def _checkpointing(model) -> bool:
    """Whether ``model``'s layers run with gradient checkpointing (transformers' flag on its layers)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # L2: the shared base
    return any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules())


def _tree_logits(policy: TrainablePolicy, prompts: list[list[int]], row_group: torch.Tensor,
                 rin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the packed prefix tree (``cascade.PrefixTree``), batch 1: the prompts' tokens (right-
    padded, so their own attention is plain causal) then the responses' inputs ``rin  # (R, M)``, response row
    ``r`` continuing prompt ``row_group[r]``. Logits of the positions that predict response tokens and of no
    other, ``(G + R * M, V)``: each prompt's last real one, then every response input (row-major)."""
    dev = rin.device
    pin, pmask = policy.pad_prompts(prompts, left=False)
    (G, Lp), (R, M) = pin.shape, rin.shape
    plens = pmask.sum(1)  # (G,)
    ids = torch.cat([pin.flatten(), rin.flatten()])[None]
    pos = torch.cat([torch.arange(Lp, device=dev).repeat(G),  # padding positions are never attended
                     (plens[row_group][:, None] + torch.arange(M, device=dev)).flatten()])[None]
    keep = torch.cat([torch.arange(G, device=dev) * Lp + plens - 1, G * Lp + torch.arange(R * M, device=dev)])
    with cascade.active(policy.model, PrefixTree(pmask, row_group, M)):
        if policy.takes_logits_to_keep:  # the model takes `logits_to_keep`: only the kept positions reach lm_head
            # squeeze, not [0]: the backward of an index zero-fills a logits-sized copy
            return policy.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep).logits.squeeze(0)
        return policy.model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, keep]


def _two_pass_logits(policy: TrainablePolicy, prompts: list[list[int]], row_group: torch.Tensor,
                     rin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Architectures without cascade attention: a forward over the distinct prompts (left-padded), then one
    over the responses on the prompts' keys/values repeated K ways (``_PrefixLayer``). Logits of each prompt's
    last position ``(G, V)`` and of every response input ``(R, M, V)``."""
    dev, model = rin.device, policy.model
    pin, pmask = policy.pad_prompts(prompts, left=True)
    cache = DynamicCache()
    last_only = {"logits_to_keep": 1} if policy.takes_logits_to_keep else {}  # logits of the last position only
    out = model(input_ids=pin, attention_mask=pmask, position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True, **{policy.cache_arg: cache}, **last_only)
    first = out.logits[:, -1]  # (G, V): predicts response token 0
    M = rin.shape[1]
    if M == 0:
        return first, first.new_zeros((rin.shape[0], 0, first.shape[-1]))
    sizes = torch.bincount(row_group).tolist()
    cache = Cache(layers=[_PrefixLayer(layer.keys, layer.values, sizes) for layer in cache.layers])
    attn = torch.cat([pmask[row_group], torch.ones_like(rin)], dim=1)  # (R, Lp + M): response padding is
    # right of real tokens, so causal attention never lets a real position see it
    rpos = pmask.sum(1)[row_group][:, None] + torch.arange(M, device=dev)
    out = model(input_ids=rin, attention_mask=attn, position_ids=rpos, use_cache=True, **{policy.cache_arg: cache})
    return first, out.logits
