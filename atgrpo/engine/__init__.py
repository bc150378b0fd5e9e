"""Rollout engines: what samples the K candidates of a tree node.

- the native engine (``native.py``): the project's own, in process, on the trainer's device: prefill once per
  prompt, cascade decoding of the K branches with a hand-run decoding step (``decoder.py``, over fused weights
  ``weights.py``), exact sampled log-probs (``sampling.py``), weights read in place (updated every step), CUDA
  graphs of the step on a GPU (``graphs.py``); models it cannot run decode through their own forward
  (``reference.py``);
- the vLLM engine (``vllm_engine.py``): vLLM in a separate process (``vllm_server.py``), weights synced after each
  update. No module here may be named ``vllm.py``: the server runs as a script from this folder, and its
  ``import vllm`` would find that module instead of vLLM.

Both are reached through a policy's ``generate(prompt_ids, n, temperature, max_new_tokens, generator)``
(``policies.protocol.Policy``).
"""

from .decoder import Decoder
from .native import native_generate
from .reference import reference_generate
from .sampling import next_tokens, sample_from, sample_tokens
from .weights import why_not

__all__ = ["Decoder", "native_generate", "next_tokens", "reference_generate", "sample_from", "sample_tokens",
           "why_not"]
