"""What every benchmark shares: shapes, prompts, the model, interleaved timing, the machine, the report files.

Methods are timed side by side in one process: each repetition runs every method once, in an order that
rotates between repetitions (so no method always runs first or last), and the report gives medians. Other
processes on the machine slow all methods alike within a repetition; the median over repetitions damps the rest.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..config import AlgoConfig
from ..policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from ..policies.tokenizer import EOS

PRESETS = {  # tiny-model shapes (random byte prompts), and a real model's (chat prompts through its template)
    "tiny": dict(prompts=8, prompt_len=(200, 200), K=8, new_tokens=16),
    "quickstart": dict(prompts=16, prompt_len=(60, 80), K=8, new_tokens=16),  # Plan-Path compact prompts
    "smollm2": dict(prompts=8, prompt_len=(300, 300), K=8, new_tokens=64, model="smollm2-135m", micro_batch_size=8,
                    token_budget=2048),
}


@dataclass
class Shape:
    prompts: int = 8  # distinct prompts (problems)
    prompt_len: tuple[int, int] = (200, 200)  # prompt tokens, drawn uniformly in [lo, hi] (BOS included)
    K: int = 8  # responses per prompt
    new_tokens: int = 16  # response tokens (EOS is suppressed, so every response has exactly this many)
    reps: int = 5
    warmup: int = 1
    seed: int = 0
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    model: str = "tiny"  # "tiny", or a real model: a preset name (smollm2-135m) or a local Hugging Face directory
    micro_batch_size: int = 256  # sequences per forward/backward (per-sample scoring; TRL's per-device batch)
    token_budget: int = 16384  # padded tokens per shared-prefix forward/backward (real models: activations are GBs)

    def algo(self, **kw) -> AlgoConfig:
        """The update settings of this shape (micro-batching as the trainer would be configured for the model)."""
        return AlgoConfig(micro_batch_size=self.micro_batch_size, update_token_budget=self.token_budget, **kw)

    @property
    def response_tokens(self) -> int:
        return self.prompts * self.K * self.new_tokens


def prompt_texts(shape: Shape, count: int | None = None) -> list[str]:
    """Seeded random lowercase prompts; with the byte tokenizer each is (length - 1) bytes + BOS."""
    g = torch.Generator().manual_seed(shape.seed)
    lo, hi = shape.prompt_len
    out = []
    for _ in range(count or shape.prompts):
        n = int(torch.randint(lo, hi + 1, (1,), generator=g)) - 1
        out.append("".join(chr(97 + int(c)) for c in torch.randint(0, 26, (n,), generator=g)))
    return out


def make_policy(shape: Shape, policy_id: str = "bench") -> CausalLMPolicy:
    """The tiny policy (seed 0 weights; every method and copy starts from the same ones), or the real model of
    ``shape.model`` (float32, CPU)."""
    if shape.model == "tiny":
        return CausalLMPolicy(policy_id, build_tiny_model(shape.tiny, 0), ByteTokenizer(), max_prompt_tokens=4096)
    is_dir = os.path.isdir(os.path.expanduser(shape.model))
    return hf_policy(shape.model if is_dir else None, None if is_dir else shape.model, 8192, policy_id)[0]


def hf_policy(model_path: str | None, preset: str | None, max_prompt_tokens: int, policy_id: str = "bench"):
    """A real model's policy from a local directory or a preset (float32 on the CPU), and its model config."""
    from ..config import ModelConfig
    from ..policies.hf import load_hf_model, make_hf_policy

    mcfg = ModelConfig(kind="hf", path=model_path, preset=None if model_path else preset,
                       max_prompt_tokens=max_prompt_tokens)
    model, tok = load_hf_model(mcfg)
    return make_hf_policy(policy_id, model, tok, mcfg), mcfg


def chat_prompt_texts(policy, count: int, target_tokens: int | tuple[int, int], seed: int) -> list[str]:
    """``count`` chat prompts of about ``target_tokens`` tokens (``(lo, hi)``: targets spread evenly from lo to
    hi), rendered through the model's chat template: Plan-Path observations (10x10 grids), the user message
    extended with more text until the rendered prompt reaches its target."""
    from ..envs import make

    lo, hi = target_tokens if isinstance(target_tokens, tuple) else (target_tokens, target_tokens)
    out = []
    for i in range(count):
        target = lo + (hi - lo) * i // max(1, count - 1)
        env = make("plan_path", style="chat", size=10, wall_prob=0.22, max_turns=4)
        env.reset(seed * 1000 + i)
        msgs = env.observe()
        text = policy.render(msgs)
        extra = 0
        while len(policy.encode(text)) < target:
            extra += 1
            more = [dict(m) for m in msgs]
            more[-1]["content"] = more[-1]["content"] + "\nNote: " + " ".join(f"cell {extra}-{j} checked"
                                                                             for j in range(extra))
            text = policy.render(more)
        out.append(text)
    return out


def bench_prompts(shape: Shape, policy: CausalLMPolicy, count: int | None = None) -> list[str]:
    """The prompt texts of a benchmark: random byte strings for the tiny model, chat prompts for a real one."""
    if shape.model == "tiny":
        return prompt_texts(shape, count)
    return chat_prompt_texts(policy, count or shape.prompts, tuple(shape.prompt_len), shape.seed)


def response_token_range(policy: CausalLMPolicy) -> tuple[int, int]:
    """Token ids [lo, hi) that random benchmark responses draw from: the vocabulary without special tokens."""
    special = getattr(policy.tokenizer, "all_special_ids", None) or [0]  # the byte tokenizer's: 0..OFFSET - 1
    return max(special) + 1, policy.model.get_output_embeddings().weight.shape[0]


def suppress_eos(model, eos_id: int = EOS, bias: float = -1e4):
    """Add ``bias`` to the EOS logit of every forward (a hook on the output layer), so all samplers produce
    exactly max_new_tokens tokens. Finite, so entropies stay finite. Returns the hook handle (``.remove()``).
    In place, on the EOS column only: adding a vocabulary-sized vector instead made a copy of every logit at every
    forward. The head's backward does not need its output, so autograd allows it."""
    def hook(mod, inp, out):
        out[..., eos_id] += bias
        return out

    return model.get_output_embeddings().register_forward_hook(hook)


def interleaved(methods: dict[str, Callable[[], object]], reps: int, warmup: int,
                progress_after: float = 2.0) -> dict[str, list[float]]:
    """Seconds per call of each method; every repetition runs all methods, order rotated; warm-ups dropped.
    A repetition that takes longer than ``progress_after`` seconds is reported on stderr (real models: minutes)."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + reps):
        shift = r % len(names)
        took = {}
        for n in names[shift:] + names[:shift]:
            t = time.perf_counter()
            methods[n]()
            took[n] = time.perf_counter() - t
            if r >= warmup:
                times[n].append(took[n])
        if sum(took.values()) > progress_after:
            what = "warm-up" if r < warmup else f"rep {r - warmup + 1}/{reps}"
            print(f"bench: {what}: " + ", ".join(f"{n} {s:.1f}s" for n, s in took.items()), file=sys.stderr,
                  flush=True)
    return times


def summarize(times: list[float], tokens: int) -> dict:
    med = statistics.median(times)
    return {"median_s": med, "times_s": [round(t, 5) for t in times], "tokens": tokens,
            "tokens_per_s": tokens / med}


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    try:
        import trl
        trl_v = trl.__version__
    except ImportError:
        trl_v = None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    from ..policies.precision import bf16_units

    return {"nproc": os.cpu_count(), "cpu_model": cpu, "bf16_units": bf16_units(), "torch_threads": torch.get_num_threads(),
            "loadavg_1m_at_start": load, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl_v}


def peak_size(n: int, dtype: torch.dtype = torch.float32, min_seconds: float = 0.05) -> int:
    """The square size a peak is measured at: ``n``, or the first size (doubling from 256) whose product takes at
    least ``min_seconds`` when that comes first. A CPU that emulates bfloat16 runs a 2048^3 product for about a
    minute; a smaller product there gives a rate of the same order."""
    m = 256
    while m < n:
        a, b = torch.randn(m, m, dtype=dtype), torch.randn(m, m, dtype=dtype)
        t = time.perf_counter()
        torch.matmul(a, b)
        if time.perf_counter() - t >= min_seconds:
            break
        m *= 2
    return min(m, n)


def matmul_peak_flops(n: int = 2048, reps: int = 5, dtype: torch.dtype = torch.float32,
                      min_seconds: float = 0.05) -> float:
    """The machine's measured matmul throughput in ``dtype`` (FLOP/s): the best of ``reps`` square products of
    size ``peak_size(n, dtype, min_seconds)``."""
    m = peak_size(n, dtype, min_seconds)
    a, b = torch.randn(m, m, dtype=dtype), torch.randn(m, m, dtype=dtype)
    torch.matmul(a, b)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * m**3 / (time.perf_counter() - t))
    return best


def matmul_peaks(n: int = 2048) -> dict[str, float]:
    """Both matmul peaks (FLOP/s) of this machine: float32 and bfloat16. MFU is taken against the peak of the
    precision a method ran in."""
    return {"float32": matmul_peak_flops(n), "bfloat16": matmul_peak_flops(n, dtype=torch.bfloat16)}


def mfu(flops: float, seconds: float, precision: str, peaks: dict[str, float], cpu: dict) -> float | None:
    """Model FLOPs utilisation against the matmul peak of ``precision``; None for bfloat16 on a CPU that emulates
    it: its measured "peak" depends on the shape far more than any real one does, so the ratio means nothing."""
    if precision == "bfloat16" and not cpu["bf16_units"]:
        return None
    return flops / seconds / peaks[precision]


def percent(x: float | None) -> float | str:
    """A share as a percentage for a report's table; "-" where there is none."""
    return "-" if x is None else 100 * x


def peaks_note(peaks: dict[str, float], cpu: dict) -> str:
    """One line for a report: the CPU, its bfloat16 units and both matmul peaks."""
    units = ", ".join(cpu["bf16_units"]) or "none: bfloat16 is emulated"
    return (f"CPU {cpu['cpu_model']} (bfloat16 units: {units}); matmul peak float32 {peaks['float32'] / 1e9:.1f} "
            f"GFLOP/s, bfloat16 {peaks['bfloat16'] / 1e9:.1f} GFLOP/s ({cpu['torch_threads']} threads)")


def autocast_twin(policy: CausalLMPolicy) -> CausalLMPolicy:
    """The same policy on a deep copy of its model run under bfloat16 autocast (float32 master weights): what a
    ``model.precision=bfloat16`` run trains and rescores with. Forward hooks (EOS suppression) come along."""
    import copy

    from ..policies.precision import apply_autocast

    twin = copy.copy(policy)
    twin.model = apply_autocast(copy.deepcopy(policy.model), "bfloat16")
    return twin


def bf16_rollout_view(policy: CausalLMPolicy):
    """What a ``model.precision=bfloat16`` run samples from: the rollout view of a bfloat16 copy of ``policy``'s
    autocast twin (``view.policy``: the twin, which scores; ``view.sampler``: the copy, which samples)."""
    from ..policies.rollout_copy import RolloutCopies

    twin = autocast_twin(policy)
    return RolloutCopies({policy.policy_id: twin}).views[policy.policy_id]


def shape_dict(shape: Shape) -> dict:
    d = asdict(shape)
    d["prompt_len"] = list(shape.prompt_len)
    return d


def write_report(out_dir: str, name: str, result: dict, rows: list[tuple], header: tuple, notes: list[str]) -> str:
    """``<out>/<name>.json`` (everything) and ``<out>/<name>.md`` (a table and notes). Returns the md text."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    sh = result["shape"]
    m = result["machine"]
    lines = [f"## {name}", "",
             f"{sh['prompts']} prompts x {sh['prompt_len'][0]}-{sh['prompt_len'][1]} tokens, K={sh['K']}, "
             f"{sh['new_tokens']} new tokens, median of {sh['reps']} interleaved reps; "
             f"{m['nproc']} x {m['cpu_model']} (bfloat16 units: {', '.join(m.get('bf16_units') or []) or 'none'}), "
             f"torch {m['torch']}, {m['torch_threads']} threads", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(x) for x in row) + " |" for row in rows]
    lines += [""] + [f"- {n}" for n in notes] + [""]
    text = "\n".join(lines)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(text)
    return text


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return str(x)
