"""``atgrpo eval RUN --benchmarks a,b,...``: several evaluation sets at once, pass@k from n samples per problem.

A benchmark is an environment and its kwargs (``BENCHMARKS``), the run's own environment (``run``), or a local
file of problems (``code:PATH`` / ``math:PATH``: JSONL, JSON, Parquet or CSV, ``docs/environments.md``).
Every problem gets n independent episodes (no tree) at ``temperature``; with c successes among them, the
unbiased estimator of pass@k (Chen et al., 2021, "Evaluating Large Language Models Trained on Code") is
``1 - C(n - c, k) / C(n, k)``, averaged over the problems. With n = 1 at temperature 0 (the default), pass@1 is
the greedy success rate of ``atgrpo eval``.

Written to the output directory (``RUN/eval/`` for a run directory): ``<benchmark>.json`` (settings and
metrics), ``<benchmark>.transcripts.jsonl`` (every episode: problem, sample, success, the turns),
``results.json`` (all benchmarks) and ``results.md`` (the table that is also printed).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Callable, Sequence

from ..rollout.sampling import Sampling

# name -> (environment, its kwargs, what it is)
BENCHMARKS: dict[str, tuple[str, dict[str, Any], str]] = {
    "humaneval": ("code", {"dataset": "humaneval"}, "HumanEval, 164 problems (coder + tester)"),
    "code-generated": ("code", {"dataset": "generated"}, "generated stdin/stdout problems, evaluation split"),
    "math-arithmetic": ("math", {"dataset": "arithmetic"}, "reasoning-gym basic arithmetic, evaluation split"),
    "math-gsm": ("math", {"dataset": "gsm"}, "reasoning-gym GSM-symbolic, evaluation split"),
    "plan_path": ("plan_path", {}, "Plan-Path, the environment's default size"),
    "sokoban": ("sokoban", {}, "Sokoban, the environment's default size"),
    "sudoku": ("sudoku", {}, "Sudoku, the environment's default size"),
}
FILE_ENVS = ("code", "math")  # environments that read a local JSONL file of problems (dataset=jsonl)
EVAL_ROWS = 256  # episodes per batched rollout
GENERATED_MATH = ("arithmetic", "gsm")  # math datasets drawn from a generator (no fixed size)


class BenchmarkError(ValueError):
    """A benchmark name, file or setting that cannot be evaluated; the message names it and the choices."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` correct among ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def resolve(spec: str, run_env: tuple[str, dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """``spec`` -> (a file-safe name, environment, kwargs). ``run``: the run's own environment and kwargs."""
    spec = spec.strip()
    if spec == "run":
        return "run", run_env[0], dict(run_env[1])
    if spec in BENCHMARKS:
        env, kwargs, _ = BENCHMARKS[spec]
        return spec, env, dict(kwargs)
    env, sep, path = spec.partition(":")
    if sep and env in FILE_ENVS:
        if not os.path.isfile(path):
            raise BenchmarkError(f"benchmark {spec!r}: no file {path!r}")
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.splitext(os.path.basename(path))[0])
        if path.lower().endswith(".jsonl"):  # the task's own JSONL reader (no extra needed)
            return f"{env}-{stem}", env, {"dataset": "jsonl", "data_path": os.path.abspath(path)}
        return f"{env}-{stem}", env, {"dataset": "files", "data_files": os.path.abspath(path)}  # json, parquet, csv
    raise BenchmarkError(f"unknown benchmark {spec!r}; choose from: run, {', '.join(BENCHMARKS)}, or a local file "
                         f"as {' / '.join(e + ':PATH' for e in FILE_ENVS)} (.jsonl, .json, .parquet, .csv)")


def fixed_size(env) -> int | None:
    """The number of distinct problems of a fixed set (HumanEval, a local file); None for generated ones."""
    if getattr(env, "dataset", None) in (None, "generated", *GENERATED_MATH):
        return None
    for attr in ("_problems", "records"):
        items = getattr(env, attr, None)
        if items:
            return len(items)
    return None




def run_benchmark(make_env: Callable[[str, int], Any], policies: dict, agent_to_policy: dict[str, str],
                  problems: int, ks: Sequence[int], sampling: Sampling, seed: int = 0
                  ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """n = ``sampling.K`` episodes on each of the evaluation problems 0..problems-1; returns the metrics (pass@k
    for each k, success_rate over all episodes, problems, samples) and one transcript record per episode."""
    import torch

    from ..rollout.tree import trajectory_rollout

    gen, n = torch.Generator().manual_seed(seed), sampling.K
    per_problem = max(1, EVAL_ROWS // n)
    correct: list[int] = []
    records: list[dict[str, Any]] = []
    for start in range(0, problems, per_problem):
        seeds = list(range(start, min(problems, start + per_problem)))
        envs = [make_env("eval", s) for s in seeds]
        _, episodes = trajectory_rollout(envs, policies, agent_to_policy, sampling, gen)
        for i, s in enumerate(seeds):
            eps = episodes[i * n:(i + 1) * n]
            correct.append(sum(bool(e.success) for e in eps))
            for j, e in enumerate(eps):
                records.append({"problem": e.problem, "seed": s, "sample": j, "success": bool(e.success),
                                "turns": e.turns, "returns": e.returns, "transcript": e.transcript})
    metrics: dict[str, float] = {}
    for k in ks:
        metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / max(1, len(correct))
    metrics["success_rate"] = sum(correct) / max(1, n * len(correct))
    metrics["problems"], metrics["samples"] = float(len(correct)), float(n * len(correct))
    return metrics, records


def parse_ks(text: str | None, n: int) -> list[int]:
    if not text:
        return [1]
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise BenchmarkError(f"--k {text!r} must be integers separated by commas, e.g. 1,5") from None
    bad = [k for k in ks if not 1 <= k <= n]
    if not ks or bad:
        raise BenchmarkError(f"--k {text!r}: every k must be in 1..n (--n {n}); pass@k needs at least k samples "
                             f"per problem")
    return ks


def table(results: dict[str, dict[str, Any]], ks: Sequence[int]) -> str:
    """The results as a markdown table: one row per benchmark."""
    head = ["benchmark", "env", "problems", "n", *[f"pass@{k}" for k in ks], "success"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, r in results.items():
        m = r["metrics"]
        cells = [name, r["env"], str(int(m["problems"])), str(r["n"]), *[f"{m[f'pass@{k}']:.3f}" for k in ks],
                 f"{m['success_rate']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def evaluate_benchmarks(target: str, specs: Sequence[str], overrides: Sequence[str], n: int, ks_text: str | None,
                        temperature: float | None, problems: int | None, out: str | None,
                        progress: bool = True) -> tuple[dict[str, dict[str, Any]], str, str]:
    """Load the run (or config) once, evaluate every benchmark, write the files; returns (results, the
    markdown table, the output directory). Every bad setting is found before any evaluation runs."""
    import copy

    from .eval_target import eval_config

    if n < 1:
        raise BenchmarkError(f"--n {n} must be >= 1 (samples per problem)")
    ks = parse_ks(ks_text, n)
    if problems is not None and problems < 1:
        raise BenchmarkError(f"--problems {problems} must be >= 1")
    specs = [s for s in (x.strip() for x in specs) if s]
    if not specs:
        raise BenchmarkError("--benchmarks needs at least one name, e.g. --benchmarks run,humaneval")
    cfg = eval_config(target, list(overrides))  # every setting is checked before torch is imported
    temp = cfg.eval.temperature if temperature is None else temperature
    if not (math.isfinite(temp) and temp >= 0):
        raise BenchmarkError(f"--temperature {temp} must be a finite number >= 0")
    if n > 1 and temp == 0:
        raise BenchmarkError(f"--n {n} samples at temperature 0 are identical; give --temperature > 0 (e.g. 0.8) "
                             f"for pass@k from several samples, or --n 1 for greedy pass@1")
    resolved = [resolve(spec, (cfg.env.name, cfg.env.kwargs)) for spec in specs]  # names and files
    names = [r[0] for r in resolved]
    if len(set(names)) != len(names):
        raise BenchmarkError(f"--benchmarks names a benchmark twice: {', '.join(names)}")
    out_dir = out or (os.path.join(target, "eval") if os.path.isdir(target) else "eval_out")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise BenchmarkError(f"--out {out_dir!r} is a file, not a directory; choose another --out")

    from ..config.checks import route_agents  # the heavy part: environments, then models
    from .evaluate import eval_state
    from .run_dir import one_line
    from .setup import env_factory, eval_sampling

    plans = []
    run_agents = route_agents(cfg, env_factory(cfg)("train", 0).agents)  # the run's agent -> policy map
    policy_ids = sorted(set(run_agents.values()))
    for spec, (name, env_name, kwargs) in zip(specs, resolved):
        bcfg = copy.deepcopy(cfg)
        bcfg.env.name, bcfg.env.kwargs = env_name, kwargs
        try:  # built on its evaluation split (HumanEval and local files have no training problems)
            make_env = env_factory(bcfg)
            probe = make_env("eval", 0)
        except Exception as e:
            raise BenchmarkError(f"benchmark {spec!r} ({env_name}, {kwargs}) cannot be built: {one_line(e)}") from None
        if len(policy_ids) == 1:
            agent_to_policy = {a: policy_ids[0] for a in probe.agents}
        elif set(probe.agents) <= set(run_agents):
            agent_to_policy = {a: run_agents[a] for a in probe.agents}
        else:
            raise BenchmarkError(f"benchmark {spec!r} has agents {', '.join(probe.agents)}; this run's policies serve "
                                 f"{', '.join(run_agents)} ({cfg.policy.sharing}: one policy per role)")
        size = fixed_size(probe)
        count = problems or cfg.eval.problems
        count = min(count, size) if size is not None else count  # a fixed set: each problem once
        plans.append((name, spec, env_name, kwargs, make_env, agent_to_policy, count, size))
    state = eval_state(target, cfg, progress)  # the work starts here: models built, warm start, final weights
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name, spec, env_name, kwargs, make_env, agent_to_policy, count, size in plans:
        if progress:
            print(f"atgrpo eval: {name}: {count} problems x {n} samples (temperature {temp:g})", flush=True)
        metrics, records = run_benchmark(make_env, state.policies, agent_to_policy, count, ks,
                                         eval_sampling(cfg, K=n, temperature=temp), cfg.seed)
        result = {"benchmark": spec, "env": env_name, "env_kwargs": kwargs, "style": cfg.env.style,
                  "sharing": cfg.policy.sharing, "n": n, "k": ks, "temperature": temp, "distinct_problems": size,
                  "target": target, "metrics": metrics}
        results[name] = result
        _write_json(os.path.join(out_dir, f"{name}.json"), result)
        with open(os.path.join(out_dir, f"{name}.transcripts.jsonl"), "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    md = table(results, ks)
    _write_json(os.path.join(out_dir, "results.json"), results)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(f"Evaluation of {target}: n={n} samples per problem, temperature {temp:g}, pass@k unbiased "
                f"estimator\n\n{md}\n")
    return results, md, out_dir


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
