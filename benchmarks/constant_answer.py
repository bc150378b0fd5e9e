"""How far does one fixed answer get? The success rate of answering every held-out problem with the same text.

A policy that has collapsed to a constant answer (RL does this when a fixed guess is rewarded often enough) is
no better than this baseline, so a task's table column means something only well above it. The single-agent
variant of the game plays each evaluation-split problem (the held-out problems of ``atgrpo eval`` and the
learning bench: seeds 0 .. N-1) and gives the same answer at every turn.

    python benchmarks/constant_answer.py sokoban size=5 max_turns=3 --answers LURDLDRULDRD
    python benchmarks/constant_answer.py sokoban size=6 max_turns=3 --random 30 --length 12
    python benchmarks/constant_answer.py plan_path size=5 wall_prob=0.2 max_turns=3 --random 30 --length 8

``--random N --length L``: N random strings of L characters from the game's answer alphabet (seed 0); the best
one is reported with its rate.
"""

from __future__ import annotations

import argparse
import random

import yaml

from atgrpo.envs.registry import make


def success_rate(env_name: str, kwargs: dict, answer: str, problems: int) -> float:
    """The fraction of the first ``problems`` evaluation-split problems solved by answering ``answer`` every turn."""
    solved = 0
    for seed in range(problems):
        env = make(env_name, split="eval", roles=("plan",), **kwargs)
        env.reset(seed)
        while not env.done:
            env.step(answer)
        solved += bool(env.success)
    return solved / problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("env", help="environment name (sokoban, plan_path, ...)")
    ap.add_argument("kwargs", nargs="*", help="environment kwargs as key=value (YAML values)")
    ap.add_argument("--answers", nargs="*", default=[], help="fixed answers to try")
    ap.add_argument("--random", type=int, default=0, help="also try this many random answers")
    ap.add_argument("--length", type=int, default=12, help="length of the random answers")
    ap.add_argument("--problems", type=int, default=100, help="held-out problems (the bench's 100)")
    args = ap.parse_args()
    kwargs = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.kwargs)}
    alphabet = make(args.env, split="eval", roles=("plan",), **kwargs).answer_alphabet()
    rng = random.Random(0)
    candidates = list(args.answers) + ["".join(rng.choice(alphabet) for _ in range(args.length))
                                       for _ in range(args.random)]
    if not candidates:
        ap.error("give --answers or --random N")
    rates = [(success_rate(args.env, kwargs, a, args.problems), a) for a in candidates]
    for rate, answer in rates[:len(args.answers)]:
        print(f"{answer}: {rate:.2f}")
    if args.random:
        rate, answer = max(rates[len(args.answers):])
        print(f"best of {args.random} random answers of length {args.length}: {answer}: {rate:.2f}")


if __name__ == "__main__":
    main()
