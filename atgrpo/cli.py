"""The ``atgrpo`` command: train | eval | envs.

    atgrpo train [CONFIG.yaml] [dotted.key=value ...] [--out RUN_DIR]
    atgrpo train --resume RUN_DIR [train.steps=N]
    atgrpo eval  (RUN_DIR | CONFIG.yaml) [dotted.key=value ...]
    atgrpo envs
    atgrpo bench (rollout | update | step | all) [--preset issue|quickstart] [--out bench_out]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .bench import cli as bench_cli
from .config import ConfigError, load_config


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
    if args.resume:
        if path is not None:
            raise ConfigError(f"--resume continues with the run's own config ({args.resume}/config.yaml); give no "
                              f"config file (only train.steps=N, to extend the run)")
        if args.out and os.path.abspath(args.out) != os.path.abspath(args.resume):
            raise ConfigError("--resume RUN_DIR writes into RUN_DIR; drop --out")
        from .trainer.run import load_resume_config

        cfg, out = load_resume_config(args.resume, overrides), args.resume
    else:
        cfg = load_config(path, overrides)  # bad keys and values fail here, before any work
        out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S") + f"-{cfg.env.name}-{cfg.policy.sharing}")
    from .trainer.run import NonFiniteError, RunError, TrainingInterrupted, train

    try:
        summary = train(cfg, out, progress=not args.quiet, resume=bool(args.resume))
    except TrainingInterrupted as e:
        print(f"atgrpo: {e}", file=sys.stderr)
        return 130
    except NonFiniteError as e:
        print(f"atgrpo: error: {e}", file=sys.stderr)
        return 3
    except RunError as e:
        print(f"atgrpo: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"run_dir": out, "eval_before": summary["eval_before"]["success_rate"],
                      "eval_after": summary["eval_after"]["success_rate"],
                      "wall_seconds": round(summary["wall_seconds"], 1)}))
    return 0


def cmd_eval(args) -> int:
    target, overrides = _split_args(args.items)
    if target is None:
        raise ConfigError("atgrpo eval needs a run directory or a config file")
    from .trainer.run import evaluate_target

    metrics = evaluate_target(target, overrides, progress=not args.quiet)
    print(json.dumps(metrics, indent=1))
    return 0


def cmd_envs(args) -> int:
    from .envs import registered

    for name, desc in registered().items():
        print(f"{name:<14} {desc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atgrpo", description="AT-GRPO: on-policy RL for teams of LLM agents")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a team (no config: the built-in CPU quickstart)")
    p.add_argument("items", nargs="*", help="[CONFIG.yaml] [dotted.key=value ...]")
    p.add_argument("--out", help="run directory (default: runs/<time>-<env>-<sharing>)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its last checkpoint, with its config (only train.steps=N "
                        "may be given, to extend it)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="evaluate a run directory or a config on held-out problems (greedy)")
    p.add_argument("items", nargs="+", help="RUN_DIR or CONFIG.yaml, then dotted.key=value overrides")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("envs", help="list the registered environments")
    p.set_defaults(func=cmd_envs)
    p = sub.add_parser("bench", help="performance benchmarks: rollout | update | step | all (JSON + markdown)")
    bench_cli.add_arguments(p)
    p.set_defaults(func=bench_cli.run)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"atgrpo: config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
