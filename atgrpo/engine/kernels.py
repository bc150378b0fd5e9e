"""The native engine's own CPU kernels (``decode_attention.cpp``, ``prefill_attention.cpp`` on
``attention_blocks.h``; ``rms_norm.cpp``, ``rotary.cpp``, ``activation.cpp``; ``vector_math.h`` shared): a
decoding step's cascade attention, the prefill's causal attention, the residual add + RMSNorm + cast, the rotary
embedding + own-cache write, and SiLU x up, each in one call.

At a table cell's shape (16 rows, prompts of ~1,000 tokens, SmolLM2's 9 query heads over 3 key/value heads) torch's
fused attention ran the prompt part at 75-90 GFLOP/s, and the own part and the merge (a second fused call, a
sigmoid, a lerp, casts) cost more than the prompt part for a fraction of its work: per layer a few dozen
operations of microseconds each. ``decode_attention`` does it all in one call per (prompt, key/value head): the
queries of the prompt's rows and of the head's query heads read each block of 16 prompt keys once (keys stored
per block transposed, ``transpose_keys``), then each row its own keys, into one row of scores per query; one
softmax over the row (float32, in two passes: its max, then exp and sum) covers both parts, so they need no
merge. ``prefill_attention`` runs the prompts' causal attention on the same blocks, and ``add_rms_norm`` replaces
the eight operations of a residual add, norm and cast.

The kernels are compiled once per machine at first use (``torch.utils.cpp_extension.load_inline``, about 30 s;
``-O3 -march=native -fopenmp``, or the target ``ATGRPO_KERNEL_MARCH`` names; cached by torch under
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``, under a name that carries the CPU's flags). Where
they cannot be built (no compiler, a failed build) or are switched off (``ATGRPO_NATIVE_KERNELS=0``) the decoder
runs its torch path, with one note on stderr saying why; ``available()`` says which.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

_DIR = Path(__file__).parent
_SOURCES = [_DIR / name for name in ("decode_attention.cpp", "prefill_attention.cpp", "rms_norm.cpp", "rotary.cpp",
                                      "activation.cpp")]
_HEADERS = [_DIR / name for name in ("attention_blocks.h", "vector_math.h")]  # included by the sources
_lock = threading.Lock()
_state: dict[str, object] = {}


def _build():
    from torch.utils.cpp_extension import load_inline

    from ..hardware import cpu_flags

    # OpenMP: at::parallel_for. No contraction into fused multiply-adds: the rotation and the norm round as
    # torch's elementwise operations do (the attention's fused multiply-adds are written out as intrinsics)
    # ATGRPO_KERNEL_MARCH: another target than this CPU (x86-64-v2: the plain loops a CPU without AVX-512 runs;
    # tests/test_engine_kernel_generic.py builds it so that those paths are tested on any machine)
    march = os.environ.get("ATGRPO_KERNEL_MARCH", "native")
    flags = ["-O3", f"-march={march}", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]
    # built for this CPU (-march=native): its name carries the CPU's flags, so that a cache directory shared by
    # machines of other CPUs (a home directory on a cluster) never hands one a build it cannot run; and the
    # headers' text and the flags, which torch's rebuild check (it hashes the sources) may not see
    key = " ".join(sorted(cpu_flags())) + "".join(h.read_text() for h in _HEADERS) + " ".join(flags)
    tag = hashlib.sha256(key.encode()).hexdigest()[:10]
    name = f"atgrpo_decode_attention_{tag}"
    try:  # say why the first run pauses (torch builds silently)
        from torch.utils.cpp_extension import _get_build_directory

        built = os.path.exists(os.path.join(_get_build_directory(name, False), f"{name}.so"))
    except Exception:  # noqa: BLE001 - a private helper of torch's: only the message depends on it
        built = True
    if not built:
        print("atgrpo: building the native engine's CPU kernels for this machine (once, about 30 s)",
              file=sys.stderr)
    return load_inline(name=name, cpp_sources=[p.read_text() for p in _SOURCES],
                       functions=["decode_attention", "prefill_attention", "add_rms_norm", "rotate_write", "silu_mul",
                                  "bf16_pairs"],
                       extra_cflags=flags, extra_include_paths=[str(_DIR)], extra_ldflags=["-fopenmp"], verbose=False)


def module():
    """The compiled kernels' module, or None (switched off, or the build failed: said once on stderr)."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            mod, why = None, None
            if os.environ.get("ATGRPO_NATIVE_KERNELS", "1") == "0":
                why = "ATGRPO_NATIVE_KERNELS=0"
            else:
                try:
                    mod = _build()
                except Exception as e:  # noqa: BLE001 - no compiler, a failed build: the torch path serves
                    why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                    print(f"atgrpo: note: the native engine's CPU attention kernel could not be built ({why}); "
                          "decoding uses torch's attention (slower)", file=sys.stderr)
            _state["module"], _state["why"] = mod, why
    return _state["module"]


def available() -> tuple[bool, str | None]:
    """(whether the kernel runs, why not)."""
    return module() is not None, _state.get("why")


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 dtype: torch.dtype) -> torch.Tensor:
    """``h += delta`` in place (the residual stream, float32 ``(A, C)``; ``delta`` float32 or bfloat16, or None),
    then ``h / rms(h) * weight`` in ``dtype`` (float32 or bfloat16): a decoding step's residual add, RMSNorm and
    cast in one call instead of eight."""
    return module().add_rms_norm(h, delta, weight, eps, dtype == torch.bfloat16)


def rotate_write(qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, own_k: torch.Tensor,
                 own_v: torch.Tensor, t: int) -> torch.Tensor:
    """A decoding step's rotary embedding and cache write in one call: the queries and keys ``qk  # (A, H + Hkv,
    D)`` rotated (``x cos + roll(x) sin``, float32, rotate_half's signs folded into ``sin  # (A, 1, D)``), the keys
    and the values ``v  # (A, Hkv, D)`` written at position ``t`` of ``own_k/v  # (A, Hkv, T, D)``; returns the
    rotated queries ``(A, H, D)`` in the cache's dtype. The same numbers as the decoder's torch operations, bit
    for bit (no fused multiply-add)."""
    return module().rotate_write(qk, v, cos, sin, own_k, own_v, t)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of gate_up's output ``(A, 2C)`` (the gate, then the up projection; float32 or
    bfloat16) in one call, in its dtype; in bfloat16 rounded as torch's two operations round (silu's result, then
    the product)."""
    return module().silu_mul(gate_up)


def transpose_keys(k: torch.Tensor) -> torch.Tensor:
    """A prompt's keys ``(G, Hkv, P, D)`` as the kernel reads them: blocks of 16 keys, each block transposed and
    contiguous, ``(G, Hkv, ceil(P / 16), D, 16)`` (zeros after P): a block is one run of memory, which the CPU's
    prefetchers follow, and 16 keys' values of one dimension are one vector. bfloat16 keys on a CPU with
    AVX512-BF16 go in pairs of dimensions, ``(..., D / 2, 16, 2)`` (viewed as ``(..., D, 16)``): two dimensions of
    16 keys are one vector of the dot-product instruction."""
    G, Hkv, P, D = k.shape
    nb = -(-P // 16)
    out = k.new_zeros((G, Hkv, nb * 16, D))
    out[:, :, :P] = k
    blocks = out.view(G, Hkv, nb, 16, D)
    if k.dtype == torch.bfloat16 and module().bf16_pairs():
        return blocks.view(G, Hkv, nb, 16, D // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(G, Hkv, nb, D, 16)
    return blocks.transpose(-1, -2).contiguous()


def pair_values(v: torch.Tensor) -> torch.Tensor:
    """A prompt's values ``(G, Hkv, P, D)`` as the kernels read them: bfloat16 values on a CPU with AVX512-BF16 (D
    a multiple of 16) in pairs of keys, ``(G, Hkv, P' / 2, D, 2)`` viewed as ``(G, Hkv, P', D)`` with P' = P
    rounded up to 16 (zeros after P): keys 2j and 2j + 1 side by side in each dimension, so that one dot-product
    instruction adds two keys' terms to 16 dimensions (the probabilities rounded to bfloat16 first, as torch's
    fused attention rounds them before its matmul with the values). Any other values as they are, contiguous.
    (``value_pairs`` in attention_blocks.h is the same rule.)"""
    G, Hkv, P, D = v.shape
    if not (v.dtype == torch.bfloat16 and D % 16 == 0 and module().bf16_pairs()):
        return v.contiguous()
    padded = -(-P // 16) * 16
    out = v.new_zeros((G, Hkv, padded, D))
    out[:, :, :P] = v
    return out.view(G, Hkv, padded // 2, 2, D).transpose(-1, -2).reshape(G, Hkv, padded, D)


def decode_attention(q: torch.Tensor, prompt_kt: torch.Tensor, prompt_v: torch.Tensor, prompt_len: torch.Tensor,
                     own_k: torch.Tensor, own_v: torch.Tensor, own_len: int, row_prompt: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Softmax attention of each row's queries ``q  # (A, H, D)`` over its prompt's keys ``prompt_kt  # (G, Hkv,
    P / 16, D, 16)`` (``transpose_keys``) and values ``prompt_v  # (G, Hkv, P, D)`` (``pair_values``), the first
    ``prompt_len[g]`` positions (``prompt_len  # (G,) int64``), and over its own keys/values ``own_k/v  # (A, Hkv,
    T, D)`` (the first ``own_len``), row ``r`` continuing prompt ``row_prompt[r]``. Returns ``(A, H * D)``
    float32. q and the keys/values in one dtype, float32 or bfloat16, contiguous."""
    return module().decode_attention(q, prompt_kt, prompt_v, prompt_len, own_k, own_v, own_len, row_prompt, scale)


def prefill_attention(q: torch.Tensor, prompt_kt: torch.Tensor, prompt_v: torch.Tensor, prompt_len: torch.Tensor,
                      starts: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal self-attention of the prompts packed into one sequence: ``q  # (N, H, D)``, prompt ``g``'s
    ``prompt_len[g]`` rows starting at ``starts[g]``, its keys ``prompt_kt`` (``transpose_keys``) and values
    ``prompt_v  # (G, Hkv, P, D)`` (``pair_values``). Returns ``(N, H * D)`` float32 (rows of no prompt 0)."""
    return module().prefill_attention(q, prompt_kt, prompt_v, prompt_len, starts, scale)
