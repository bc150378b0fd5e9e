"""Rollouts from a bfloat16 copy of each policy (``model.precision: bfloat16``), as an inference engine holds its
own copy of the weights.

The trainer keeps float32 master weights (and AdamW states) and runs its forward and backward under bfloat16
autocast (``precision.py``): every linear layer's input and weight are cast to bfloat16, the residual stream,
the normalisations and the LM head stay float32. Autocast casts every weight again at every forward, which for
decoding (one forward per new token) costs more than the bfloat16 matmul saves. So sampling runs on a separate
copy (``RolloutCopies``) whose linear layers hold their weights in bfloat16 already: it runs under the same
autocast, which finds nothing left to cast, and so computes what the trainer computes (scored side by side on
SmolLM2-135M: the same log-probs to the last bit, but for the head, below), without the casts. The copy is
made once; the weights that train are freed while the update runs (``release``: the update has their memory)
and made again from the new weights after it (``refresh``: only the parameters that train, so for per-role LoRA
(L2) only the role's adapter; the frozen base is cast once, and the roles share it). The
embeddings, the norms and the residual stream stay float32, as under autocast; a whole model in bfloat16 drifts
further from the trainer (0.047 on SmolLM2; ``benchmarks/copy_gap.py``).

The LM head is the largest matmul of a decoding step (on SmolLM2 a fifth of the parameters, 49k logits per row),
and the trainer runs it in float32. In bfloat16 it rounds logits near 20 to steps of 0.125 (on SmolLM2 that alone
put the copy's log-probs 0.024 from the trainer's on average). So the copy's head (``_topk_exact_head``) runs in
bfloat16 to rank the vocabulary, then recomputes the ``EXACT_TOP`` highest logits of each row in float32 from
the float32 weights: the tokens that hold almost all the probability, and so almost every sampled token and the
log-sum-exp, get the trainer's logits; the rest keep their rounded ones (their errors, small against their tiny
probabilities, average out in the sum). Its bfloat16 weight is re-cast at every refresh that changes the head.

The loss does not take the copy's log-probs on trust: the update scores every sampled response with the
trainer's model before its first optimizer step (``trainer.update.take_trainer_logprobs``: the first mini-batch's
own forward, one no-grad pass for the others), and the copy's log-probs only feed ``rollout/logprob_gap/<policy>``
(cascade decoding and the packed scoring pass round differently in bfloat16, so the gap is small, not zero).
"""

from __future__ import annotations

import copy
import time
import types
from typing import Sequence

import torch
import torch.nn.functional as F

from ..engine.weights import EXACT_TOP, exact_top
from ..rollout.logprob_gap import RescoredView
from .causal_lm import Completion
from .protocol import TrainablePolicy


def _root(model: torch.nn.Module) -> torch.nn.Module:
    """The module that owns the weights: per-role LoRA's ``AdapterView`` holds the shared peft model."""
    return model.__dict__.get("peft", model)


def _under_autocast(root: torch.nn.Module) -> bool:
    """Whether ``precision.apply_autocast`` wrapped some module of ``root`` (the model; under peft its base)."""
    return any("atgrpo_autocast" in m.__dict__ for m in root.modules())


def _cast_linear_weights(root: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every linear layer's weight and bias to ``dtype`` (what autocast would cast them to at each forward), but
    the LM head's: it runs in float32 under autocast (and is the input embedding too when the two are tied)."""
    head = root.get_output_embeddings()
    for m in root.modules():
        if isinstance(m, torch.nn.Linear) and m is not head:
            for p in (m.weight, m.bias):
                if p is not None:
                    p.data = p.data.to(dtype)


def _topk_exact_head(self, x: torch.Tensor) -> torch.Tensor:
    """The copy's LM head (bound to it): bfloat16 logits from ``atgrpo_weight_lp``, the ``EXACT_TOP`` highest of
    each row recomputed in float32 from the float32 ``weight``; float32 logits out."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        logits = F.linear(x.to(self.atgrpo_weight_lp.dtype), self.atgrpo_weight_lp).float()  # (..., V)
        return exact_top(self, x, logits)


def _cast_head(head: torch.nn.Module, dtype: torch.dtype) -> None:
    """(Re)make the head's ``dtype`` weight from its float32 one."""
    head.atgrpo_weight_lp = head.weight.detach().to(dtype)


class CopyPolicy(RescoredView):
    """A policy's rollout view: samples with ``sampler`` (the trainer policy's class on the copy), marking what it
    sampled as owed the trainer's log-probs (``policy``: the trainer's)."""

    def __init__(self, policy: TrainablePolicy, sampler: TrainablePolicy):
        super().__init__(policy)
        self.sampler = sampler

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        return self.mark_owed(self.sampler.generate(prompt_ids, n, temperature, max_new_tokens, generator), temperature)


class RolloutCopies:
    """The rollout copies of ``policies`` (policy id -> trainer policy, each under bfloat16 autocast) and their
    rollout views (``views``).

    Policies that share one module (L2's adapters on one peft model) share one copy: all of them are deep-copied
    with one memo, so the copy keeps the sharing. ``refresh(pids)`` brings the copies of ``pids`` up to the
    trainer's weights; ``pop_metrics`` gives the time spent refreshing."""

    def __init__(self, policies: dict[str, TrainablePolicy], dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        t = time.perf_counter()
        memo: dict[int, object] = {}
        self.views: dict[str, CopyPolicy] = {}
        for pid in sorted(policies):
            trainer = policies[pid]
            if not _under_autocast(_root(trainer.model)):
                raise ValueError(f"policy {pid!r}: a rollout copy needs the trainer's model under bfloat16 autocast "
                                 f"(precision.apply_autocast), so that both compute the same")
            sampler = copy.copy(trainer)  # same class, tokenizer and settings; its own model below
            sampler.model = copy.deepcopy(trainer.model, memo)  # the autocast wrappers come along, rebound
            self.views[pid] = CopyPolicy(trainer, sampler)
        for root in {id(_root(v.sampler.model)): _root(v.sampler.model) for v in self.views.values()}.values():
            _cast_linear_weights(root, dtype)
            for p in root.parameters():
                p.requires_grad_(False)
            root.eval()
            head = root.get_output_embeddings()
            if head is not None and head.weight.dtype == torch.float32:
                _cast_head(head, dtype)
                head.forward = types.MethodType(_topk_exact_head, head)
        self.refresh_s = {"all": time.perf_counter() - t}

    def _trained(self, pid: str):
        """(the copy's parameter, the trainer's) for each trainable weight of ``pid`` (L2: the role's adapter
        only), and the copy's head when the trainer's head trains (else None)."""
        view = self.views[pid]
        root = _root(view.sampler.model)
        dst = dict(root.named_parameters())
        pairs = [(dst[name], p) for name, p in view.policy.model.named_parameters() if p.requires_grad]
        head = root.get_output_embeddings()
        trains = head is not None and hasattr(head, "atgrpo_weight_lp") and any(
            p.requires_grad for p in _root(view.policy.model).get_output_embeddings().parameters())
        return pairs, head if trains else None

    def release(self, pids: Sequence[str]) -> None:
        """Free the copies' trainable weights of ``pids`` (their storages; shapes and dtypes stay) for the
        update's memory: the update changes them, so the copy is made again from the new weights anyway
        (``refresh``). On SmolLM2-135M with one shared policy that is the whole copy, 0.36 GiB (``atgrpo
        plan-memory``'s sampler term)."""
        for pid in pids:
            pairs, head = self._trained(pid)
            for q, _ in pairs:
                q.data = q.data.new_empty(0)
            if head is not None:
                head.atgrpo_weight_lp = head.atgrpo_weight_lp.new_empty(0)

    @torch.no_grad()
    def refresh(self, pids: Sequence[str]) -> None:
        """Make the copies' trainable weights of ``pids`` from the trainer's current ones (cast to the copy's
        dtypes): in place, or anew where ``release`` freed them."""
        for pid in pids:
            t = time.perf_counter()
            pairs, head = self._trained(pid)
            for q, p in pairs:
                if q.shape == p.shape:
                    q.copy_(p)
                else:  # released
                    q.data = p.detach().to(q.dtype, copy=True)
            if head is not None:
                _cast_head(head, self.dtype)
            self.refresh_s[pid] = time.perf_counter() - t

    def pop_metrics(self) -> dict[str, float]:
        """The seconds spent refreshing the copies since the last call."""
        m = {"time/rollout_copy_refresh": sum(self.refresh_s.values())}
        self.refresh_s = {}
        return m
