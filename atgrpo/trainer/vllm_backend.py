"""``rollout.engine=vllm``: the local backend with rollouts sampled on vLLM (``engine/vllm_engine.py``).

Engines: L0/L1/L3 one per policy (full weights); L2 one for all roles, every role's LoRA adapter resident
(``enable_lora``), each request with its role's adapter. After every update the updated policies' weights go
to their engine without a restart: full weights through the worker's in-place reload, adapters as a new
adapter version (the old one removed). At start-up the engines get the weights as they are then (after a warm
start, or a resumed checkpoint). The loss uses the trainer's log-probs, which the update computes
(``trainer.update.take_trainer_logprobs``); the engine's are only compared with them
(``rollout/logprob_gap/<policy>/{mean,max}``). Evaluation stays on the native engine (greedy, ``state.policies``).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING

from ..config import Config, max_new_tokens_any
from ..policies.precision import resolve_precision
from ..rollout.records import Sample
from ..engine.vllm_engine import EnginePolicy, VLLMEngine, lora_rank_limit, shm_dir
from .backend import LocalBackend
from .state import TrainState

if TYPE_CHECKING:
    from .update import UpdateStats


class VLLMBackend(LocalBackend):
    """A ``backend.Backend``: ``LocalBackend`` whose rollouts sample on vLLM engines (``EnginePolicy`` views)."""

    def __init__(self, cfg: Config, state: TrainState):
        from ..policies.hf import resolve_model_dir

        self.cfg = cfg
        model_dir = resolve_model_dir(cfg.model)
        v = cfg.rollout.vllm
        max_len = v.max_model_len or cfg.model.max_prompt_tokens + max_new_tokens_any(cfg)  # longest role's
        # the engine computes in the run's precision (bfloat16 weights when model.precision resolves to bfloat16)
        dtype = resolve_precision(cfg.model, cfg.system.backend)[0]
        kw = dict(vcfg=v, dtype=dtype, seed=cfg.seed, max_model_len=max_len)
        pids = sorted(state.policies)
        self.lora = cfg.policy.sharing == "L2"
        self.engines: dict[str, VLLMEngine] = {}
        self.adapters: dict[str, tuple[str, int, str]] = {}
        self._next_lora_id = 1
        self.lora_dir = shm_dir("atgrpo-lora-") if self.lora else None
        t = time.perf_counter()
        try:
            if self.lora:
                engine = VLLMEngine(model_dir, lora={"max_loras": len(pids),
                                                     "max_rank": lora_rank_limit(cfg.policy.lora.rank)},
                                    name="lora", **kw)
                self.engines = {pid: engine for pid in pids}
            else:
                for pid in pids:
                    self.engines[pid] = VLLMEngine(model_dir, name=pid, **kw)
            self.startup_s = time.perf_counter() - t
            self.sync_s = self.sync(state, pids)
        except BaseException:
            self.close()
            raise
        self.views = {pid: EnginePolicy(state.policies[pid], self.engines[pid], self.adapters.get(pid))
                      for pid in pids}
        self._first = True

    def sync(self, state: TrainState, pids: list[str]) -> dict[str, float]:
        """The current weights of ``pids`` into their engines; seconds per policy."""
        out = {}
        for pid in pids:
            t = time.perf_counter()
            policy = state.policies[pid]
            if self.lora:
                name, lid = pid, self._next_lora_id
                self._next_lora_id += 1
                path = os.path.join(self.lora_dir, f"{pid}-{lid}")
                policy.model.save_pretrained(path)  # the role's adapter, peft format
                old = self.adapters.get(pid)
                self.adapters[pid] = (name, lid, path)
                if pid in getattr(self, "views", {}):
                    self.views[pid].adapter = self.adapters[pid]
                if old is not None:
                    self.engines[pid].remove_lora(old[1])
                    shutil.rmtree(old[2], ignore_errors=True)
            else:
                self.engines[pid].load_weights(policy.model.state_dict())
            out[pid] = time.perf_counter() - t
        return out

    def rollout_policies(self, state: TrainState) -> dict[str, EnginePolicy]:
        return self.views

    def update(self, state: TrainState, batches: dict[str, list[Sample]]) -> dict[str, UpdateStats]:
        out = super().update(state, batches)
        self.sync_s = self.sync(state, [pid for pid, b in batches.items() if b])
        return out

    def step_metrics(self) -> dict[str, float]:
        m = {}
        for pid, s in self.sync_s.items():
            m[f"time/weight_sync/{pid}"] = s
        m["time/weight_sync"] = sum(self.sync_s.values())
        if self._first:  # once: how long the engines took to start
            m["time/engine_startup"] = self.startup_s
            self._first = False
        return m

    def close(self) -> None:
        for e in {id(e): e for e in self.engines.values()}.values():
            e.close()
        self.engines = {}
        if self.lora_dir:
            shutil.rmtree(self.lora_dir, ignore_errors=True)
