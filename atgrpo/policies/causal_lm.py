"""A policy backed by any transformers causal LM: batched shared-prefix sampling and response log-probs.

Sampling is plain temperature sampling, nothing else (no top-p, top-k or repetition penalty), so the
log-probabilities stored at sampling time and those the loss computes come from the same distribution
``softmax(logits / T)`` (docs/method.md, pitfall 4). ``temperature=0`` means greedy decoding (eval).

Generation is the rollout engine's (``atgrpo/engine``): each distinct prompt prefilled once, its ``n`` branches
decoded together with cascade attention (the prompt's keys/values one copy, read once per step for all its
branches), by the engine's own decoding step where it can run the model (``engine/decoder.py``), else through
the model's forward (``engine/reference.py``). Rows that have emitted EOS are dropped so they stop costing
compute.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from . import cascade
from .lean_layers import make_lean
from .logprobs import model_logprobs


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
    whether decoding and scoring may use cascade attention; ``lean_layers``, whether its norms and MLPs run as
    ``lean_layers.make_lean`` makes them."""

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
        # norms and SwiGLU that keep only their inputs for the backward (lean_layers.py; the same forward)
        self.lean_layers = make_lean(base) > 0
        # decode with the native engine's own step (engine/decoder.py) where it can run the model
        self.native_decoder = True
        self.cuda_graphs = True  # on CUDA, replay the native decoding step as captured graphs (engine/graphs.py)

    # ---- prompts --------------------------------------------------------------------------------------
    @classmethod
    def renderer(cls, policy_id: str, tokenizer, max_prompt_tokens: int, **attrs):
        """A policy of this class without a model: ``render`` and ``encode`` only, as the run's policy renders
        and tokenises prompts (``atgrpo check``, before any weights are loaded). ``attrs``: the class's own
        settings (``HFPolicy``: ``chat_template_kwargs``)."""
        policy = cls.__new__(cls)
        policy.policy_id, policy.tokenizer, policy.max_prompt_tokens = policy_id, tokenizer, max_prompt_tokens
        policy.prompt_prefix_ids = list(getattr(tokenizer, "prompt_prefix_ids", ()))
        policy.__dict__.update(attrs)
        return policy

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
        """``n`` completions for each prompt: result[i][k] is branch k of prompt i. Decoded by the native
        engine's own step (``engine.decoder``) where the model allows, else by the model's forward
        (``engine.reference``); both draw the same uniform numbers (``engine.sampling``)."""
        from ..engine import native_generate, reference_generate

        if not prompt_ids:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            decoder = self.decoder()
            if decoder is not None:
                out_tok, out_lp = native_generate(self, decoder, prompt_ids, n, temperature, max_new_tokens,
                                                  generator)
            else:
                out_tok, out_lp = reference_generate(self, prompt_ids, n, temperature, max_new_tokens, generator)
        finally:
            self.model.train(was_training)
        comps = []
        for ids_row, lp_row in zip(out_tok.tolist(), out_lp.tolist()):
            ids = [t for t in ids_row if t >= 0]
            done = bool(ids) and ids[-1] == self.eos_id
            comps.append(Completion(ids, lp_row[:len(ids)] if temperature > 0 else [], self.decode(ids), done))
        B = len(prompt_ids)
        return [comps[i * n:(i + 1) * n] for i in range(B)]

    def decoder(self):
        """The native engine's decoder of this policy's model (built once per model), or None where it cannot
        run it (``engine.weights.why_not``) or ``native_decoder`` is off."""
        from ..engine import Decoder, why_not

        if not self.native_decoder:
            return None
        cached = self.__dict__.get("_decoder")
        if cached is None or cached[0] is not self.model:
            cached = (self.model, Decoder(self.model) if why_not(self.model) is None else None)
            self._decoder = cached
        return cached[1]

    def release_decoder_weights(self) -> None:
        """Free the decoder's fused, packed weights (made again at its next use: ``DecoderWeights.release``)."""
        cached = self.__dict__.get("_decoder")
        if cached is not None and cached[1] is not None:
            cached[1].weights.release()

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
        targets = torch.zeros((B, T), dtype=torch.long, device=self.device)
        for i, r in enumerate(response_ids):
            targets[i, :len(r)] = torch.tensor(r)
        rows = tgt_idx + keep * torch.arange(B, device=self.device)[:, None]  # into logits flattened to (B * keep, V)

        def forward() -> torch.Tensor:  # (B, keep, V): the positions that predict response tokens
            if self.takes_logits_to_keep:
                return self.model(input_ids=seq, attention_mask=attn, logits_to_keep=keep).logits
            return self.model(input_ids=seq, attention_mask=attn).logits[:, L - keep:]

        return model_logprobs(self.model, forward, targets, temperature, rows=rows) * mask, mask  # (B, T)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
