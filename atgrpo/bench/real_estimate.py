"""How long a cell of the real-model table takes: measured when cells of its task and row (or, for a team row,
the other team row) have finished, else a rough cost model of its config (for ``atgrpo bench real-table
--dry-run`` and the progress lines).

The cost model counts the work a config asks for and prices it with three constants fitted to two measured
SmolLM2-135M runs on a quiet 2-core AMD EPYC with 2 torch threads (docs/results.md, "A real pretrained model"):

- warm start: demonstrations x epochs x (prompt + response tokens) at ``WARM_S_PER_TOKEN`` (math L1: about 86
  demonstrations of about 190 tokens took 123 s);
- RL steps and evaluations: every sampled response (rollouts: problems x K x agents x turns per step;
  evaluations: problems x agents x turns each) at ``S_PER_SAMPLE + S_PER_TOKEN x max_new_tokens`` (the mean
  cap of the acting roles: a response is priced at its cap, as if it never stopped early), fitted so
  that math L1 (about 1320 responses of <= 40 tokens after its warm start: 860 s) and Plan-Path 5x5 L1 (about
  590 responses of <= 360 tokens: 1813 s) come out as measured.

The prompt lengths and turns per episode below are estimates per task, not measurements. With one torch thread
on a busy machine a cell takes longer; its measured time replaces the estimate once it has finished.
"""

from __future__ import annotations

import statistics
from typing import Any

WARM_S_PER_TOKEN = 6.7e-3
S_PER_SAMPLE = 0.35
S_PER_TOKEN = 7.6e-3
# chat prompt tokens and turns per episode, per task (estimates)
PROMPT_TOKENS = {"math": 150, "plan_path": 450, "sokoban": 500, "sudoku": 400, "code": 450}
TURNS = {"math": 1.8, "plan_path": 1.5, "sokoban": 2.0, "sudoku": 1.5, "code": 2.0}
# the single agent's turns where they differ: math's reasoner alone ends at its first boxed answer
# (configs/real/math_single_grpo.yaml sampled 1344 = 12 steps x 28 problems x K 4 responses: one turn each)
SINGLE_TURNS = {"math": 1.0}
# the team's roles and the single agent's (L0) role, per task
ROLES = {"math": ("tool", "reasoner"), "code": ("coder", "tester")}
SINGLE_ROLE = {"math": "reasoner", "code": "coder"}


def roles(task: str, sharing: str) -> tuple[str, ...]:
    """The roles that act in a run of ``task`` (games: tool and plan agents; L0: the single agent's role)."""
    if sharing == "L0":
        return (SINGLE_ROLE.get(task, "plan"),)
    return ROLES.get(task, ("tool", "plan"))


def evaluations(steps: int, every: int) -> int:
    """Held-out evaluations of a run: before RL, every ``every`` steps before the last, and after RL."""
    middle = len([s for s in range(every, steps, every)]) if every else 0
    return 2 + middle


def model_seconds(task: str, cfg: Any) -> float:
    """The cost model's seconds for one run of ``cfg`` (a loaded Config) of ``task``."""
    acting = roles(task, cfg.policy.sharing)
    agents = len(acting)
    turns = SINGLE_TURNS.get(task, TURNS.get(task, 2.0)) if cfg.policy.sharing == "L0" else TURNS.get(task, 2.0)
    # the mean response cap over the acting roles (rollout.per_agent over rollout.max_new_tokens)
    new = sum((cfg.rollout.per_agent.get(r) or {}).get("max_new_tokens", cfg.rollout.max_new_tokens)
              for r in acting) / agents
    demos = cfg.warmstart.episodes * agents * turns * cfg.warmstart.epochs if cfg.warmstart.enabled else 0
    warm = demos * (PROMPT_TOKENS.get(task, 500) + new) * WARM_S_PER_TOKEN
    samples = cfg.train.steps * cfg.rollout.problems_per_step * cfg.rollout.K * agents * turns
    samples += evaluations(cfg.train.steps, cfg.eval.every) * cfg.eval.problems * agents * turns
    return warm + samples * (S_PER_SAMPLE + S_PER_TOKEN * new)


# the team rows, each the other's stand-in for a time: the same episodes, with one model or one per role
# (Sokoban L3 27.6 and 38.4 min against L1 38.9 and 43.9; math 20.7 and 16.8 against 16.7 on a quiet machine)
TEAM_ROWS = ("mas_L1", "mas_L3")


def estimate(task: str, row: str, cfg: Any, finished: list[dict[str, Any]],
             earlier: list[dict[str, Any]] = ()) -> tuple[float, str]:
    """A cell's estimated seconds and where it comes from: the mean wall time of the finished cells of the same
    task and row ("measured"), else of the task's other team row ("measured as mas_L1"); failing both, the same
    from the cells of an earlier config (``earlier``, the stale cells: "measured, earlier config"); else the cost
    model ("model"), which has come out 2-2.5x short for the program-writing games' team cells."""
    stand_ins = [(row, "measured")]
    if row in TEAM_ROWS:
        other = next(r for r in TEAM_ROWS if r != row)
        stand_ins.append((other, f"measured as {other}"))
    for cells, when in ((finished, ""), (earlier, ", earlier config")):
        for r, source in stand_ins:
            times = [c["wall_seconds"] for c in cells if c["task"] == task and c["row"] == r]
            if times:
                return statistics.fmean(times), source + when
    return model_seconds(task, cfg), "model"
