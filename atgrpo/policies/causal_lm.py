"""A policy backed by any transformers causal LM: batched shared-prefix sampling and response log-probs.

Sampling is plain temperature sampling, nothing else (no top-p, top-k or repetition penalty), so the
log-probabilities stored at sampling time and those the loss computes come from the same distribution
``softmax(logits / T)`` (docs/method.md, pitfall 4). ``temperature=0`` means greedy decoding (eval).

Generation prefills each distinct prompt once; its ``n`` branches then decode with cascade attention
(``cascade.py``: the prompt's keys/values stay one copy, read once per step for all its branches) or, on
architectures where that is not known to be exact, from a K-way expanded cache with the whole length reserved
(``kv_cache.py``: decode steps write in place). Rows that have emitted EOS are dropped so they stop costing
compute.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from . import cascade
from .kv_cache import CascadeCache, ReservedCache
from .logprobs import token_logprobs


SAMPLE_BLOCK = 256  # tokens per block of the two-level inverse CDF in ``sample_tokens``


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs  # (A, V)`` (rows need not sum to 1), drawn by inverting the cumulative
    distribution with one uniform number per row, in two levels: the row's blocks of ``SAMPLE_BLOCK`` tokens by
    their summed mass, then the token inside the chosen block; sums and running sums in float64, so that a token
    of probability 1e-12 keeps an interval of its own size. A token of probability 0 is never drawn (its
    interval is empty). ``torch.multinomial`` draws V exponential numbers per row instead, and a one-level running
    sum writes V float64 numbers per row: on SmolLM2's 49k-token vocabulary they cost 16-25x the two levels per
    decoding step of 64 rows (``python benchmarks/sample_tokens_cost.py``; docs/performance.md)."""
    A, V = probs.shape
    pad = (-V) % SAMPLE_BLOCK
    blocks = (F.pad(probs, (0, pad)) if pad else probs).view(A, -1, SAMPLE_BLOCK)  # (A, nb, S)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (A, nb)
    u = torch.rand((A, 1), generator=generator, dtype=torch.float64, device=probs.device) * block_cdf[:, -1:]
    b = torch.searchsorted(block_cdf, u, right=True).clamp_(max=block_cdf.shape[1] - 1)  # (A, 1)
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(u))
    inner = blocks.gather(1, b[:, :, None].expand(-1, -1, SAMPLE_BLOCK)).squeeze(1).double().cumsum(-1)  # (A, S)
    last = (inner < inner[:, -1:]).sum(-1, keepdim=True)  # the block's last token of positive probability
    t = torch.minimum(torch.searchsorted(inner, u - before, right=True), last)  # rounding may not pass it
    return (b * SAMPLE_BLOCK + t).squeeze(1)


@dataclass
class Completion:
    ids: list[int]  # response tokens, EOS included when produced
    logprobs: list[float]  # log p(token) under softmax(logits / T) at sampling time; empty when greedy
    text: str  # decoded response without special tokens
    finished: bool  # True when EOS was produced within max_new_tokens
    trainer_logprobs: bool = True  # False: ``logprobs`` are another sampler's (a rollout copy, vLLM), and the
    # update takes the trainer's own in their place (``trainer.update.take_trainer_logprobs``)


class CausalLMPolicy:
    """One trainable policy (``protocol.TrainablePolicy``): a causal LM, its tokenizer, and the device it lives on.

    The tokenizer is a Hugging Face tokenizer or anything with the calls of one that are used here (the byte
    tokenizer, ``tokenizer.ByteTokenizer``): ``tokenizer(text, add_special_tokens=False)["input_ids"]``,
    ``decode(ids, skip_special_tokens=True)``, ``chat_template`` (None: messages are rendered as plain text),
    ``apply_chat_template``, ``eos_token_id`` and ``pad_token_id``. A tokenizer may also name ``prompt_prefix_ids``:
    ids put before every prompt's tokens (the byte tokenizer's BOS); Hugging Face tokenizers name none, their
    chat templates write the special tokens into the prompt text.

    Public attributes the model code reads (``shared_prefix.py`` too): ``cache_arg``, the name of the model's
    KV-cache argument; ``takes_logits_to_keep``, whether its forward takes ``logits_to_keep``; ``cascade``,
    whether decoding and scoring may use cascade attention."""

    def __init__(self, policy_id: str, model, tokenizer, device: str = "cpu", max_prompt_tokens: int = 4096):
        self.policy_id = policy_id
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.device = device
        self.max_prompt_tokens = max_prompt_tokens
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        # ids before every prompt's own tokens, read once from the tokenizer (ByteTokenizer: BOS; HF: none)
        self.prompt_prefix_ids = list(getattr(tokenizer, "prompt_prefix_ids", ()))
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # transformers >= 5.2x names the KV-cache argument `cache`; older releases `past_key_values`
        params = inspect.signature(type(base).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        # prefill needs the last position's logits only; a (B, L, V) tensor is GBs for big vocabularies
        self.takes_logits_to_keep = "logits_to_keep" in params
        # decode with cascade attention (cascade.py) on the architectures it is tested on; else one cache copy
        # per branch (ReservedCache)
        self.cascade = cascade.supports(base.config)

    # ---- prompts --------------------------------------------------------------------------------------
    def render(self, prompt: str | list[dict[str, str]]) -> str:
        """Prompt text: compact prompts as they are; chat messages through the tokenizer's chat template."""
        if isinstance(prompt, str):
            return prompt
        if not getattr(self.tokenizer, "chat_template", None):
            return "".join(f"<{m['role']}>\n{m['content']}\n" for m in prompt) + "<assistant>\n"
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        """Prompt ids: ``prompt_prefix_ids``, then the text's tokens with no special token added (a chat
        template's text already holds its special tokens)."""
        ids = self.prompt_prefix_ids + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"prompt of {len(ids)} tokens exceeds max_prompt_tokens={self.max_prompt_tokens} "
                             f"(policy {self.policy_id}); raise model.max_prompt_tokens or shorten the prompt")
        return ids

    def encode_response(self, text: str) -> list[int]:
        """A response's token ids as the policy emits them after a prompt: the text's tokens with no special
        token added (no BOS: a tokenizer that prepends one to every string must not put it in an answer),
        ended by EOS. Warm-start demonstrations use it, so they are tokenised as rollouts are."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids) + [self.eos_id]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def pad_prompts(self, prompts: Sequence[Sequence[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids, mask  # (B, Lp)`` on the policy's device: the prompts padded on the left (all end at column
        Lp - 1, as ``generate`` needs) or on the right (all start at column 0)."""
        Lp = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), Lp), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), Lp), dtype=torch.long)
        for j, p in enumerate(prompts):
            cols = slice(Lp - len(p), Lp) if left else slice(0, len(p))
            ids[j, cols], mask[j, cols] = torch.tensor(list(p), dtype=torch.long), 1
        return ids.to(self.device), mask.to(self.device)

    # ---- sampling -------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        """``n`` completions for each prompt: result[i][k] is branch k of prompt i."""
        if not prompt_ids:
            return []
        was_training = self.model.training
        self.model.eval()
        B, dev = len(prompt_ids), self.device
        input_ids, attn = self.pad_prompts(prompt_ids, left=True)  # every prompt ends at column Lp - 1
        Lp = input_ids.shape[1]
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, Lp)
        shared = self.cascade and n > 1  # each prompt's keys one copy, read once per step for its n branches
        # else the whole length reserved: decode steps write in place, no per-step copy of the prompt
        cache = CascadeCache(attn, max_new_tokens) if shared else ReservedCache(Lp + max_new_tokens)
        last_only = {"logits_to_keep": 1} if self.takes_logits_to_keep else {}  # logits of the last position only
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         **{self.cache_arg: cache}, **last_only)
        logits = out.logits[:, -1].float().repeat_interleave(n, 0)  # (R, V), R = B * n
        cache.batch_repeat_interleave(n)
        attn = attn.repeat_interleave(n, 0)
        next_pos = pos[:, -1].repeat_interleave(n, 0) + 1  # (R,)
        R = B * n
        rows = torch.arange(R, device=dev)  # which output row each live cache row belongs to
        out_tok = torch.full((R, max_new_tokens), -1, dtype=torch.long, device=dev)  # -1: not generated
        out_lp = torch.zeros((R, max_new_tokens), device=dev)
        with cascade.active(self.model, cache) if shared else contextlib.nullcontext():
            for step in range(max_new_tokens):
                if temperature > 0:
                    logp_all = F.log_softmax(logits / temperature, dim=-1)
                    tok = sample_tokens(logp_all.exp(), generator)  # (A,)
                    out_lp[rows, step] = logp_all.gather(1, tok[:, None]).squeeze(1)
                else:
                    tok = logits.argmax(-1)
                out_tok[rows, step] = tok
                finished = tok == self.eos_id
                if step == max_new_tokens - 1 or bool(finished.all()):
                    break
                if bool(finished.any()):  # drop finished rows: they stop costing compute
                    keep = (~finished).nonzero().squeeze(1)
                    cache.batch_select_indices(keep)
                    rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
                attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
                out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                 use_cache=True, **{self.cache_arg: cache})
                logits = out.logits[:, -1].float()
                next_pos = next_pos + 1
        self.model.train(was_training)
        comps = []
        for ids_row, lp_row in zip(out_tok.tolist(), out_lp.tolist()):
            ids = [t for t in ids_row if t >= 0]
            done = bool(ids) and ids[-1] == self.eos_id
            comps.append(Completion(ids, lp_row[:len(ids)] if temperature > 0 else [], self.decode(ids), done))
        return [comps[i * n:(i + 1) * n] for i in range(B)]

    # ---- scoring --------------------------------------------------------------------------------------
    def response_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]],
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(response tokens | prompt) under softmax(logits / T), with gradients.

        Returns ``logp  # (B, T)`` and ``mask  # (B, T)``, T = the longest response; rows right-padded.
        """
        B = len(prompt_ids)
        lens = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
        L, T = max(lens), max(len(r) for r in response_ids)
        seq = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        tgt_idx = torch.zeros((B, T), dtype=torch.long)  # position whose logits predict response token t
        mask = torch.zeros((B, T))
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            seq[i, :lens[i]] = torch.tensor(p + r)
            attn[i, :lens[i]] = 1
            tgt_idx[i, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            mask[i, :len(r)] = 1
        # logits of the last `keep` positions only (every response token is predicted from there on)
        keep = L - min(len(p) for p in prompt_ids) + 1
        tgt_idx = (tgt_idx - (L - keep)).clamp(min=0)  # padding entries (masked) may not point before the window
        seq, attn, tgt_idx, mask = (x.to(self.device) for x in (seq, attn, tgt_idx, mask))
        if self.takes_logits_to_keep:
            logits = self.model(input_ids=seq, attention_mask=attn, logits_to_keep=keep).logits  # (B, keep, V)
        else:
            logits = self.model(input_ids=seq, attention_mask=attn).logits[:, L - keep:]
        targets = torch.zeros((B, T), dtype=torch.long, device=self.device)
        for i, r in enumerate(response_ids):
            targets[i, :len(r)] = torch.tensor(r)
        rows = tgt_idx + keep * torch.arange(B, device=self.device)[:, None]  # into logits flattened to (B * keep, V)
        return token_logprobs(logits, targets, temperature, rows=rows) * mask, mask  # (B, T)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
