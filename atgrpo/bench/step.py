"""A whole single-agent GRPO step, atgrpo against TRL's ``GRPOTrainer``, on the same model (the tiny one, or a
real one with ``--preset smollm2``: chat prompts, the model's own tokenizer on both sides).

One step = sample K responses to each of P prompts, score them, group advantages, one optimizer step over
all P * K responses (one mini-batch, no KL, clip 0.2, token-level normalisation: TRL's default ``dapo`` loss
matches atgrpo's token-mean). Both start from the same weights, see the same prompt texts (identical token
ids: TRL gets a ``PreTrainedTokenizerFast`` with the byte vocabulary of ``ByteTokenizer``), sample at
temperature 1 with no top-k/top-p, run on the CPU in one precision, and have EOS suppressed (so every response
has ``new_tokens`` tokens; checked on both sides). In float32 both are plain float32. In bfloat16 (``precision``)
both keep float32 master weights and compute in bfloat16: TRL with ``bf16=True`` (autocast), atgrpo as a
``model.precision=bfloat16`` run does (rollout from a bfloat16 copy refreshed after the update, the trainer's
log-probs taken in the update, the loss under autocast). TRL runs with gradient checkpointing off (its default
is on, which would slow it down), no reference model (``beta=0``), no vLLM (transformers ``generate``).

The two are interleaved in one process: a TRL callback times each TRL step (``on_step_begin`` to
``on_step_end``, which spans generation, scoring, loss, backward and the optimizer step) and then runs and times
one atgrpo step. TRL is a benchmark-only dependency (``pip install trl``); without it only atgrpo is timed and
the report says why.
"""

from __future__ import annotations

import copy
import time

import torch

from ..algorithms.advantages import grouped_advantages
from ..config import AlgoConfig
from ..policies.rollout_copy import RolloutCopies
from ..policies.tokenizer import BOS, EOS, OFFSET, PAD
from ..rollout.records import Sample
from ..trainer.update import make_optimizer, update_policy
from .common import (Shape, autocast_twin, bench_prompts, interleaved, machine, make_policy, shape_dict, summarize,
                     suppress_eos, write_report)


def reward_fn(text: str) -> float:
    """A cheap, deterministic reward of a response text (the same function for both trainers)."""
    return text.count("a") / max(1, len(text))


def atgrpo_step(policy, optimizer, prompt_ids: list[list[int]], shape: Shape, algo: AlgoConfig,
                gen: torch.Generator, copies=None) -> int:
    """One GRPO step through atgrpo's own code: batched K-way generate (from ``copies``, a ``RolloutCopies`` of
    ``policy``, when given; refreshed after the update), group advantages, ``update_policy``. Returns the number
    of response tokens."""
    sampler = copies.views[policy.policy_id] if copies is not None else policy
    comps = sampler.generate(prompt_ids, shape.K, 1.0, shape.new_tokens, gen)
    samples = []
    for i, (p, row) in enumerate(zip(prompt_ids, comps)):
        for k, c in enumerate(row):
            r = reward_fn(c.text)
            samples.append(Sample(problem=f"p{i}", branch=k, turn=0, agent="solo", policy=policy.policy_id,
                                  prompt="", prompt_ids=p, response=c.text, response_ids=c.ids, logprobs=c.logprobs,
                                  reward_team=0.0, reward_local=r, reward=r, selected=k == 0, finished=c.finished,
                                  trainer_logprobs=c.trainer_logprobs))
    adv, _ = grouped_advantages(torch.tensor([s.reward for s in samples]),
                                torch.arange(len(prompt_ids)).repeat_interleave(shape.K))
    for s, a in zip(samples, adv.tolist()):
        s.advantage = a
    update_policy(policy, optimizer, samples, algo, 1.0, gen)
    if copies is not None:
        copies.refresh([policy.policy_id])
    return sum(len(s.response_ids) for s in samples)


def byte_tokenizer_fast():
    """A ``PreTrainedTokenizerFast`` that maps text to exactly ``ByteTokenizer.encode(text, add_bos=True)``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):  # GPT-2's reversible byte -> printable character map
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, **{chr(c): b + OFFSET for b, c in zip(bs, cs)}}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def bench_step(shape: Shape, out_dir: str, name: str = "step", command: str | None = None,
               with_trl: bool = True, precision: str = "float32") -> dict:
    steps = shape.warmup + shape.reps
    ours = make_policy(shape)
    texts = bench_prompts(shape, ours, shape.prompts * steps)  # step s uses texts[s*P:(s+1)*P], on both sides
    suppress_eos(ours.model, ours.eos_id)
    copies = None
    if precision == "bfloat16":
        ours = autocast_twin(ours)
        copies = RolloutCopies({ours.policy_id: ours})
    algo = shape.algo(minibatches=1, lr=1e-6)
    opt = make_optimizer(ours, algo)
    gen = torch.Generator().manual_seed(shape.seed)
    ids = [ours.encode(t) for t in texts]
    counter = {"ours": 0}

    def ours_step():
        s = counter["ours"]
        counter["ours"] += 1
        toks = atgrpo_step(ours, opt, ids[s * shape.prompts:(s + 1) * shape.prompts], shape, algo, gen, copies)
        assert toks == shape.response_tokens, f"atgrpo step produced {toks} tokens, expected {shape.response_tokens}"

    trl_info: dict = {"available": False}
    if with_trl:
        try:
            import trl  # noqa: F401
            trl_info = {"available": True}
        except ImportError as e:
            trl_info = {"available": False, "reason": f"import trl failed: {e} (pip install trl)"}
    if trl_info["available"]:
        times, trl_info = _run_with_trl(shape, texts, ids, ours_step, steps, ours, precision == "bfloat16")
    else:
        times = interleaved({"atgrpo": ours_step}, shape.reps, shape.warmup)
    res = {m: summarize(t, shape.response_tokens) for m, t in times.items()}
    target = 4.0 if shape.model == "tiny" else 3.0  # a real model's step is mostly model compute on both sides
    ratios = {}
    if "trl" in res:
        ratios["atgrpo_vs_trl"] = res["trl"]["median_s"] / res["atgrpo"]["median_s"]
    result = {"bench": "step", "precision": precision, "shape": shape_dict(shape), "machine": machine(),
              "methods": res, "ratios": ratios,
              "targets": {"atgrpo_vs_trl": target}, "trl": trl_info, "command": command}
    rows = [(m, shape.response_tokens, res[m]["median_s"], res[m]["tokens_per_s"]) for m in res]
    notes = ([f"atgrpo vs TRL GRPOTrainer: {ratios['atgrpo_vs_trl']:.2f}x (target >= {target:g}x)"] if ratios else
             [f"TRL not measured: {trl_info.get('reason')}"])
    notes.append(f"precision {precision} on both sides" + ("" if precision == "float32" else
                 " (float32 master weights; TRL bf16=True; atgrpo: rollout from a bfloat16 copy)"))
    write_report(out_dir, name, result, rows, ("trainer", "response tokens / step", "median s / step", "tokens/s"),
                 notes)
    return result


def _run_with_trl(shape: Shape, texts: list[str], ids: list[list[int]], ours_step, steps: int, ours, bf16: bool):
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = byte_tokenizer_fast() if shape.model == "tiny" else ours.tokenizer
    assert all(tok(t)["input_ids"] == i for t, i in zip(texts, ids)), "TRL's tokenization disagrees with atgrpo's"
    model = copy.deepcopy(make_policy(shape).model)
    suppress_eos(model, ours.eos_id)
    times = {"trl": [], "atgrpo": []}
    lengths: list[float] = []

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            dt = time.perf_counter() - self.t
            t = time.perf_counter()
            ours_step()
            if state.global_step > shape.warmup:
                times["trl"].append(dt)
                times["atgrpo"].append(time.perf_counter() - t)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    per_device = min(shape.micro_batch_size, shape.prompts * shape.K)  # the same sequences per pass as ours
    assert (shape.prompts * shape.K) % per_device == 0, "micro_batch_size must divide prompts * K"
    cfg = GRPOConfig(output_dir="/tmp/atgrpo_bench_trl", per_device_train_batch_size=per_device,
                     num_generations=shape.K, max_completion_length=shape.new_tokens,
                     gradient_accumulation_steps=shape.prompts * shape.K // per_device,
                     max_steps=steps, learning_rate=1e-6, lr_scheduler_type="constant", beta=0.0, epsilon=0.2,
                     temperature=1.0, top_k=0, top_p=1.0, gradient_checkpointing=False, bf16=bf16, use_cpu=True,
                     shuffle_dataset=False, logging_steps=1, report_to="none", save_strategy="no",
                     disable_tqdm=True, dataloader_num_workers=0, seed=shape.seed)
    def reward(completions, **kw):
        return [reward_fn(c) for c in completions]

    trainer = GRPOTrainer(model=model, reward_funcs=reward,
                          args=cfg, train_dataset=Dataset.from_dict({"prompt": texts}), processing_class=tok,
                          callbacks=[Interleave()])
    trainer.train()
    assert lengths and all(x == shape.new_tokens for x in lengths), f"TRL completion lengths {lengths}"
    info = {"available": True, "version": trl.__version__, "loss_type": cfg.loss_type,
            "gradient_checkpointing": cfg.gradient_checkpointing, "completion_mean_lengths": lengths}
    return times, info
