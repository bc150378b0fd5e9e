"""The ``atgrpo`` command: train | eval | report | envs | bench | plan-memory.

    atgrpo train [CONFIG.yaml] [dotted.key=value ...] [--out RUN_DIR]
    atgrpo train --resume RUN_DIR [train.steps=N]
    atgrpo eval  (RUN_DIR | CONFIG.yaml) [dotted.key=value ...]
    atgrpo report RUN_DIR [RUN_DIR ...] [--out FILE] [--screenshot PNG [--view HASH]]
    atgrpo envs
    atgrpo bench (rollout | update | step | all) [--preset issue|quickstart] [--out bench_out]
    atgrpo plan-memory [CONFIG.yaml] [dotted.key=value ...] [--model NAME | --model-config PATH] [--gpu-gb 80]

Every failure ends in one line on stderr (``atgrpo: ...``) and an exit status; ``--debug`` adds the traceback:

    0    done
    1    an unexpected error (a bug, or the machine: out of memory); --debug shows where
    2    bad input, before any work: a config key or value, a config file, arguments, the run directory (in use,
         already a run, a file, nothing intact to resume), resources (Ray workers that do not fit); or a file
         of a run (or a report) that cannot be written (a full disk, an I/O error, a read-only directory, a
         directory in its place): the line names the file, the cause and what to do; what was written before is
         intact
    3    stopped: too many updates skipped for a non-finite loss or gradient (train.max_nonfinite)
    4    stopped: Ray rollout/update workers (or nodes) were lost more often than system.ray.max_failures
    130  stopped by Ctrl-C or SIGTERM after a checkpoint (atgrpo train --resume RUN_DIR continues)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from .api import run_config
from .bench import cli as bench_cli
from .config import ConfigError

EXIT_ERROR, EXIT_INPUT, EXIT_STOPPED, EXIT_LOST, EXIT_INTERRUPTED = 1, 2, 3, 4, 130  # the module docstring says when


def _split_args(items: list[str]) -> tuple[str | None, list[str]]:
    """The optional config path (first item without '=') and the overrides."""
    path = None
    overrides = []
    for it in items:
        if "=" in it:
            overrides.append(it)
        elif path is None:
            path = it
        else:
            raise ConfigError(f"unexpected argument {it!r}: give one config file, then dotted.key=value overrides")
    return path, overrides


def cmd_train(args) -> int:
    path, overrides = _split_args(args.items)
    cfg, out = run_config(path, overrides, args.out, args.resume)  # bad keys and values fail here, before any work
    if os.path.exists(out) and not os.path.isdir(out):  # also checked by train(); here before heavy imports
        print(f"atgrpo: error: run directory {out!r} is a file, not a directory; choose another --out",
              file=sys.stderr)
        return EXIT_INPUT
    from .preflight import train_blockers
    from .trainer.run import NonFiniteError, RecoveryExhausted, TrainingInterrupted, train
    from .trainer.write_faults import RunWriteError

    blockers = train_blockers(cfg, out)  # what `atgrpo check` finds that the run would stop on later
    if blockers:
        for f in blockers:
            print(f"atgrpo: error: {f.area}: {f.text}", file=sys.stderr)
        return EXIT_INPUT
    try:
        summary = train(cfg, out, progress=not args.quiet, resume=bool(args.resume))
    except TrainingInterrupted as e:
        print(f"atgrpo: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except NonFiniteError as e:
        print(f"atgrpo: error: {e}", file=sys.stderr)
        return EXIT_STOPPED
    except RecoveryExhausted as e:
        print(f"atgrpo: error: {e}", file=sys.stderr)
        return EXIT_LOST
    except RunWriteError as e:  # a full disk, an I/O error (a checkpoint too): one line that says what is intact
        print(f"atgrpo: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    print(json.dumps({"run_dir": out, "eval_before": summary["eval_before"]["success_rate"],
                      "eval_after": summary["eval_after"]["success_rate"],
                      "wall_seconds": round(summary["wall_seconds"], 1)}))
    return 0


def cmd_eval(args) -> int:
    target, overrides = _split_args(args.items)
    if target is None:
        raise ConfigError("atgrpo eval needs a run directory or a config file")
    if args.benchmarks is not None:
        from .trainer.benchmarks import BenchmarkError, evaluate_benchmarks

        try:
            _, table, out = evaluate_benchmarks(target, args.benchmarks.split(","), overrides, args.n, args.k,
                                                args.temperature, args.problems, args.out, progress=not args.quiet)
        except BenchmarkError as e:
            raise ConfigError(str(e)) from None
        print(table)
        print(f"written: {out}/results.md, {out}/results.json, {out}/<benchmark>.json, "
              f"{out}/<benchmark>.transcripts.jsonl")
        return 0
    if any(v is not None for v in (args.k, args.temperature, args.problems, args.out)) or args.n != 1:
        raise ConfigError("--n, --k, --temperature, --problems and --out go with --benchmarks")
    from .trainer.eval_target import eval_config

    eval_config(target, overrides)  # a bad target or override is said before torch is imported
    from .trainer.evaluate import evaluate_target

    metrics = evaluate_target(target, overrides, progress=not args.quiet)
    print(json.dumps(metrics, indent=1))
    return 0


def cmd_check(args) -> int:
    from .preflight import check

    path, overrides = _split_args(args.items)
    found = check(path, overrides, args.out)
    for f in found:
        print(f.line(), flush=True)
    failed = [f for f in found if f.level == "FAIL"]
    print(f"{len(failed)} problem(s): the run cannot start" if failed else "the run can start")
    return 2 if failed else 0


def cmd_plan_memory(args) -> int:
    from . import plan_memory as pm
    from .config.checks import validate_env
    from .config.loading import read_config
    from .config.schema import check_fields
    from .plan_report import format_plan

    if args.gpu_gb <= 0 or any(n is not None and n < 1 for n in (args.prompt_tokens, args.new_tokens)):
        raise ConfigError("--gpu-gb must be > 0, --prompt-tokens and --new-tokens >= 1")
    path, overrides = _split_args(args.items)
    cfg = read_config(path, overrides)  # a plan for a GPU machine may be made on a laptop: no device checks
    check_fields(cfg)
    shape = pm.plan_shape(cfg, args.model, args.model_config)
    roles = validate_env(cfg)  # the environment fits its kwargs; the policies the run builds (route_agents)
    settings = pm.settings_from_config(cfg, roles, args.prompt_tokens, args.new_tokens)
    try:
        print(format_plan(shape, settings, args.gpu_gb))
        if cfg.rollout.engine == "vllm":
            print("rollout.engine=vllm: the rollout's KV cache is vLLM's, in its own process "
                  "(rollout.vllm.gpu_memory_utilization of the GPU), not the kv_cache and sampling above")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return 0


def cmd_report(args) -> int:
    """One HTML file with the runs' curves, sampled trees and held-out transcripts; ``--screenshot``: open it in
    headless Chromium too, save a PNG of ``--view`` and fail (exit 1) if the page logs an error."""
    from .report import REPORT_FILE, write_report
    from .runs import NotARunError
    from .trainer.write_faults import io_fault, remedy

    if args.view and not args.screenshot:
        raise ConfigError("--view goes with --screenshot")
    try:
        out = write_report(args.runs, args.out, warn=lambda note: print(f"atgrpo: warning: {note}", file=sys.stderr))
    except (NotARunError, FileNotFoundError) as e:
        print(f"atgrpo: error: {_line(e)}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as e:  # the page could not be written (a full disk, a directory in its place): one line
        path = args.out or (os.path.join(args.runs[0], REPORT_FILE) if len(args.runs) == 1 else REPORT_FILE)
        fault = io_fault(e, path)
        if fault is None:
            raise
        print(f"atgrpo: error: could not write {path} ({fault[1]}): {remedy(fault[0], path)}", file=sys.stderr)
        return EXIT_INPUT
    print(f"report: {out} ({os.path.getsize(out) / 1e6:.1f} MB)")
    if args.screenshot:
        from .report.browser import Browser, BrowserError, NoChromium, file_url

        try:
            with Browser() as b:
                b.open(file_url(out, args.view))
                png, errors = b.screenshot(), b.log.errors + [f"request: {u}" for u in b.log.requests]
        except BrowserError as e:
            print(f"atgrpo: error: {_line(e)}", file=sys.stderr)
            return EXIT_INPUT if isinstance(e, NoChromium) else EXIT_ERROR
        with open(args.screenshot, "wb") as f:
            f.write(png)
        print(f"screenshot: {args.screenshot}")
        if errors:
            print("atgrpo: error: the page logged: " + " | ".join(errors), file=sys.stderr)
            return EXIT_ERROR
    return 0


def cmd_envs(args) -> int:
    from .envs import registered

    for name, desc in registered().items():
        print(f"{name:<14} {desc}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block."""

    def error(self, message: str):
        print(f"atgrpo: usage error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere on the line: atgrpo --debug train ... or atgrpo train ... --debug
    argv = [a for a in argv if a != "--debug"]
    try:
        return _main(argv, debug)
    except SystemExit:
        raise
    except ConfigError as e:
        _report(debug, f"atgrpo: config error: {_line(e)}")
        return EXIT_INPUT
    except KeyboardInterrupt:
        _report(debug, "atgrpo: interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:
        run_dir = sys.modules.get("atgrpo.trainer.run_dir")  # not loaded: e cannot be one of its errors
        if run_dir is not None and isinstance(e, run_dir.RunError):
            _report(debug, f"atgrpo: error: {_line(e)}")
            return EXIT_INPUT
        _report(debug, f"atgrpo: error: {type(e).__name__}: {_line(e)} (run again with --debug for the traceback)")
        return EXIT_ERROR


def _report(debug: bool, line: str) -> None:
    if debug:
        traceback.print_exc()
    print(line, file=sys.stderr, flush=True)


def _main(argv: list[str], debug: bool) -> int:
    parser = _Parser(prog="atgrpo", description="AT-GRPO: on-policy RL for teams of LLM agents",
                     epilog="--debug (anywhere): print the traceback of an error. Exit status: 0 done, 1 unexpected "
                            "error, 2 bad input (config, arguments, run directory, resources) or a run's file that "
                            "cannot be written (full disk, I/O error), 3 stopped on "
                            "non-finite updates, 4 Ray workers lost too often, 130 stopped by a signal (resumable)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("train", help="train a team (no config: the built-in CPU quickstart)")
    p.add_argument("items", nargs="*", help="[CONFIG.yaml] [dotted.key=value ...]")
    p.add_argument("--out", help="run directory (default: runs/<time>-<env>-<sharing>)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its last checkpoint, with its config (only train.steps=N "
                        "may be given, to extend it)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="evaluate a run directory or a config on held-out problems (greedy), or on "
                                    "several benchmarks with pass@k (--benchmarks)")
    p.add_argument("items", nargs="+", help="RUN_DIR or CONFIG.yaml, then dotted.key=value overrides")
    p.add_argument("--benchmarks", metavar="A,B,...",
                   help="evaluation sets: run (the run's own env), humaneval, code-generated, math-arithmetic, "
                        "math-gsm, plan_path, sokoban, sudoku, or local files code:PATH / math:PATH (jsonl, json, "
                        "parquet, csv); "
                        "writes RUN_DIR/eval/ (results.md, results.json, per-benchmark JSON and transcripts)")
    p.add_argument("--n", type=int, default=1, help="--benchmarks: samples per problem (default 1)")
    p.add_argument("--k", metavar="K1,K2", help="--benchmarks: pass@k for these k <= n (default 1)")
    p.add_argument("--temperature", type=float,
                   help="--benchmarks: sampling temperature (default eval.temperature: 0, greedy; n > 1 needs > 0)")
    p.add_argument("--problems", type=int, help="--benchmarks: problems per benchmark (default eval.problems; "
                                                "a fixed set such as HumanEval: at most its size)")
    p.add_argument("--out", help="--benchmarks: output directory (default RUN_DIR/eval, or eval_out/ for a config)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("check", help="everything a run needs (config, model, tokenizer, prompts, sandbox, engine, "
                                     "Ray, device and memory, output directory), checked in seconds: exit 0 when it "
                                     "can start, 2 with every problem listed")
    p.add_argument("items", nargs="*", help="[CONFIG.yaml] [dotted.key=value ...]")
    p.add_argument("--out", help="the run directory the run would write (default: under runs/)")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("plan-memory", help="memory per model (weights, grads, optimizer, activations, KV cache) "
                                           "and the GPUs a config needs, from its model's shape alone")
    p.add_argument("items", nargs="*", help="[CONFIG.yaml] [dotted.key=value ...]")
    p.add_argument("--model", metavar="NAME", help="plan for a built-in shape instead: qwen3-1.7b, qwen3-8b")
    p.add_argument("--model-config", metavar="PATH", help="plan for the model of this config.json (or directory)")
    p.add_argument("--gpu-gb", type=float, default=80.0, help="GiB of memory per GPU (default 80)")
    p.add_argument("--prompt-tokens", type=int, help="the longest prompt (default model.max_prompt_tokens)")
    p.add_argument("--new-tokens", type=int, help="the longest response (default rollout.max_new_tokens)")
    p.set_defaults(func=cmd_plan_memory)
    p = sub.add_parser("report", help="one self-contained HTML file of runs: curves, the sampled trees, held-out "
                                      "transcripts (several runs: overlaid)")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="the HTML file (default: RUN_DIR/report.html for one run, report.html for several)")
    p.add_argument("--screenshot", metavar="PNG", help="also open it in headless Chromium and save a screenshot "
                                                       "(exit 1 if the page logs an error)")
    p.add_argument("--view", default="", metavar="HASH", help="with --screenshot: the view, e.g. trees/0/1/0/2 "
                   "(run, step, problem, node), transcripts/0/failure (default: the overview)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("envs", help="list the registered environments")
    p.set_defaults(func=cmd_envs)
    p = sub.add_parser("bench", help="performance benchmarks: rollout | update | step | all (JSON + markdown)")
    bench_cli.add_arguments(p)
    p.set_defaults(func=bench_cli.run)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
