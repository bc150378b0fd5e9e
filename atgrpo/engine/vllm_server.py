"""The vLLM engine process: one ``vllm.LLM`` serving token-id requests for the trainer (``vllm_engine.py``).

Run by the trainer as ``<python> vllm_server.py`` with the Python that has vLLM installed, which may be another
virtual environment than the trainer's (vLLM pins its own torch and transformers; docs/models.md). This file
imports nothing from atgrpo: only the standard library, torch, safetensors and vLLM.

Protocol: a ``multiprocessing.connection`` (Unix socket) to the trainer; the address comes in
``ATGRPO_VLLM_ADDRESS``, the key in ``ATGRPO_VLLM_AUTHKEY`` (hex). The first message is the engine's settings;
then one request (a dict with ``op``) and one reply at a time. A failed request answers ``{"error": ...}``
and the engine keeps serving.

- ``generate``: prompts as token ids, ``n`` samples per prompt, seeded; the sampled tokens' log-probs under
  ``softmax(logits / T)`` (``logprobs_mode=processed_logprobs``, no top-k / top-p / penalties); an optional
  LoRA adapter per prompt (all prompts of one call with an adapter, or all without: never mixed).
- ``load_weights``: full weights from a safetensors file, through the worker's in-place ``reload_weights``,
  then the prefix cache is cleared (its keys/values came from the old weights).
- ``remove_lora``: drop an adapter version that a newer one replaced.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

CPU_TOKEN_BUDGET = 4096  # tokens per engine step on CPU (at least max_model_len: whole prompts only)


def _reload_from_file(worker, path: str) -> int:
    """Runs inside vLLM's worker (``collective_rpc``): the weights of ``path`` replace the model's in place."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    worker.reload_weights(weights_iterator=iter(tensors.items()))
    return len(tensors)


class Server:
    def __init__(self, settings: dict):
        from vllm import LLM
        from vllm.platforms import current_platform

        self.settings = settings
        kw = dict(model=settings["model"], tokenizer=settings["model"], dtype=settings["dtype"],
                  seed=int(settings["seed"]), max_model_len=int(settings["max_model_len"]),
                  enable_prefix_caching=True, logprobs_mode="processed_logprobs", generation_config="vllm",
                  skip_tokenizer_init=True, enforce_eager=True)
        if current_platform.is_cpu():
            kw["kv_cache_memory_bytes"] = int(settings["kv_cache_gb"] * 2**30)
            # no chunked prefill on CPU: a partly prefilled seeded request has its sampled token discarded and its
            # generator rewound (set_offset), which CPU generators refuse ("CPU Generator does not use offset")
            kw.update(enable_chunked_prefill=False,
                      max_num_batched_tokens=max(int(settings["max_model_len"]), CPU_TOKEN_BUDGET))
        else:
            kw["gpu_memory_utilization"] = float(settings["gpu_memory_utilization"])
        if settings.get("lora"):
            kw.update(enable_lora=True, max_loras=int(settings["lora"]["max_loras"]),
                      max_lora_rank=int(settings["lora"]["max_rank"]))
        self.llm = LLM(**kw)

    def generate(self, prompts, n, temperature, max_tokens, stop_ids, seed, loras=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        if loras is not None:
            if len(loras) != len(prompts):
                raise ValueError(f"{len(loras)} adapters for {len(prompts)} prompts")
            if any(x is None for x in loras) and not all(x is None for x in loras):
                raise ValueError("prompts with and without a LoRA adapter in one call: vLLM may serve the "
                                 "adapter-less rows with an adapter; split the call")
        greedy = temperature <= 0  # vLLM seeds branch k of a request with seed + k: requests n seeds apart
        params = [SamplingParams(n=n, temperature=0.0 if greedy else float(temperature), top_p=1.0, top_k=0,
                                 min_p=0.0, max_tokens=int(max_tokens), stop_token_ids=list(stop_ids),
                                 ignore_eos=True, logprobs=None if greedy else 0, seed=int(seed) + i * n,
                                 detokenize=False, skip_special_tokens=False)
                  for i in range(len(prompts))]
        reqs = None
        if loras is not None and loras[0] is not None:
            reqs = [LoRARequest(name, int(lid), path) for name, lid, path in loras]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 lora_request=reqs, use_tqdm=False)
        result = []
        for out in outs:
            row = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [] if greedy else [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
                row.append((ids, lps, c.finish_reason == "stop"))
            result.append(row)
        return result

    def load_weights(self, path: str) -> dict:
        t = time.perf_counter()
        counts = self.llm.collective_rpc(_reload_from_file, args=(path,))
        self.llm.reset_prefix_cache()
        return {"tensors": counts[0], "seconds": time.perf_counter() - t}

    def remove_lora(self, lora_id: int) -> dict:
        return {"removed": bool(self.llm.llm_engine.remove_lora(int(lora_id)))}


def main() -> int:
    from multiprocessing.connection import Client

    conn = Client(os.environ["ATGRPO_VLLM_ADDRESS"], authkey=bytes.fromhex(os.environ["ATGRPO_VLLM_AUTHKEY"]))
    settings = conn.recv()
    t = time.perf_counter()
    try:
        server = Server(settings)
    except BaseException as e:  # the trainer raises it with this message
        traceback.print_exc()
        conn.send({"error": f"{type(e).__name__}: {e}"})
        return 1
    import vllm

    conn.send({"ok": True, "startup_s": time.perf_counter() - t, "vllm": vllm.__version__})
    while True:
        try:
            req = conn.recv()
        except EOFError:  # the trainer is gone
            return 0
        op = req.pop("op")
        if op == "shutdown":
            conn.send({"ok": True})
            return 0
        try:
            conn.send({"result": getattr(server, op)(**req)})
        except Exception as e:
            traceback.print_exc()
            conn.send({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    sys.exit(main())
