"""What this machine's CPU computes natively, and the run's precision chosen from it, without importing torch.

``policies/precision.py`` applies the choice (autocast, the rollout copy); ``atgrpo plan-memory`` plans with it
on machines where importing torch is not wanted.
"""

from __future__ import annotations

from typing import Sequence

BF16_UNITS = ("amx_bf16", "avx512_bf16")  # x86 flags (/proc/cpuinfo) of native bfloat16 arithmetic
ARM_BF16 = "bf16"  # aarch64's BFloat16 extension (the flag of /proc/cpuinfo's Features line)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel lists them (/proc/cpuinfo's ``flags`` or ``Features``); empty when
    they cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def bf16_units(flags: Sequence[str] | set[str] | None = None) -> list[str]:
    """The CPU's native bfloat16 units among ``flags`` (default: this CPU's): ``amx_bf16``, ``avx512_bf16``
    (x86), ``bf16`` (aarch64). Empty: bfloat16 matmuls are emulated (converted to float32 and back)."""
    have = cpu_flags() if flags is None else set(flags)
    return [u for u in (*BF16_UNITS, ARM_BF16) if u in have]


def resolve_precision(mcfg, backend: str = "local", flags: Sequence[str] | set[str] | None = None
                      ) -> tuple[str, str]:
    """``(precision, why)`` for a ``ModelConfig``: ``model.precision`` when it is not ``auto``; otherwise
    ``bfloat16`` when the model is a Hugging Face model in float32 weights on a CPU with native bfloat16 units
    (``flags``: the CPU's, for tests) or ``model.autocast`` already asks for bfloat16 compute, and ``float32``
    otherwise. Weights stored in bfloat16 or float16 (``model.dtype``) are their own compute precision."""
    if mcfg.dtype != "float32":
        return mcfg.dtype, f"model.dtype={mcfg.dtype}: the weights themselves are in {mcfg.dtype}"
    if mcfg.precision != "auto":
        return mcfg.precision, f"model.precision={mcfg.precision}"
    if mcfg.autocast == "bfloat16":
        return "bfloat16", "model.autocast=bfloat16"
    if mcfg.kind != "hf":
        return "float32", "the tiny model runs in float32"
    if not str(mcfg.device).startswith("cpu"):
        return "float32", f"auto picks bfloat16 on CPUs only; set model.precision=bfloat16 on {mcfg.device}"
    units = bf16_units(flags)
    if not units:
        return "float32", "this CPU has no native bfloat16 units (amx_bf16, avx512_bf16): bfloat16 would be emulated"
    if backend != "local":
        return "float32", f"auto keeps float32 on system.backend={backend}; set model.precision=bfloat16 to change"
    return "bfloat16", f"this CPU computes bfloat16 natively ({', '.join(units)})"


