"""How long and how fast are a game's expert programs, in the tokens of a config's model?

For a chat code-mode config (e.g. configs/real/table/sokoban_mas_L1.yaml): the scripted tool agent's program on
held-out instances, its length in the model's tokens (what a warm-started model must learn to write and what
``rollout.max_new_tokens`` must hold), whether its printed answer solves the instance (``atgrpo bench experts``'s
check, on this config's env settings) and its slowest run. Needs only the model's tokenizer.

    python benchmarks/expert_program_tokens.py configs/real/table/sokoban_mas_L1.yaml --problems 60
"""

from __future__ import annotations

import argparse

from atgrpo.bench.experts import expert_program_outcomes, expert_program_tokens
from atgrpo.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--problems", type=int, default=60)
    args = ap.parse_args()
    cfg = load_config(args.config, [])
    lengths = expert_program_tokens(cfg, args.problems)
    out = expert_program_outcomes(cfg.env.name, args.problems, dict(cfg.env.kwargs))
    print(f"{cfg.env.name} {dict(cfg.env.kwargs)}: {args.problems} held-out instances; program tokens "
          f"min {min(lengths)} max {max(lengths)} (rollout.max_new_tokens {cfg.rollout.max_new_tokens}); "
          f"solved {out['solved']}, crashed {out['crashed']}, timed out {out['timed_out']}, "
          f"{out['seconds_per_run']:.3f} s per run")


if __name__ == "__main__":
    main()
