"""The real-model table (``atgrpo bench real-table``): its tasks, rows, cells and their configs.

The paper's table with SmolLM2-135M-Instruct (offline preset, chat prompts) on five task families. Rows:

- ``single``: the single agent, no RL: the before-RL evaluation of the ``single_grpo`` cell (same warm start);
- ``single_grpo``: the single agent (L0) trained with GRPO;
- ``mas``: the team, no RL: the before-RL evaluation of the ``mas_L1`` cell (same warm start);
- ``mas_L1``: the team with AT-GRPO, one shared model;
- ``mas_L3``: the team with AT-GRPO, one model per role (as the paper).

So the cells that run are task x RL row (``single_grpo``, ``mas_L1``, ``mas_L3``) x seed; the no-RL rows cost
nothing extra. Every row of a task gets the same warm-start budget (optimizer steps on demonstrations) and about
the same number of sampled responses: the single agent plays ``SINGLE_SCALE[task]`` times the warm-start episodes
and problems per step of the team, since a team episode yields demonstrations and samples for two roles.

Each RL cell's config is ``configs/real/table/<task>_<row>.yaml``, written from the definitions below by
``write_configs`` (``python -m atgrpo.bench.real_table --write-configs configs/real/table``); tests check the
committed files equal what it writes, so they can be run alone: ``atgrpo train configs/real/table/math_mas_L1.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import ConfigError, overrides_tree

ROWS = ("single", "single_grpo", "mas", "mas_L1", "mas_L3")
ROW_TITLES = {"single": "single agent (no RL)", "single_grpo": "single agent + GRPO", "mas": "MAS (no RL)",
              "mas_L1": "MAS + AT-GRPO shared (L1)", "mas_L3": "MAS + AT-GRPO per role (L3)"}
# a row without RL is read from its RL cell's evaluation before RL
NO_RL_SOURCE = {"single": "single_grpo", "mas": "mas_L1"}
RL_ROWS = ("single_grpo", "mas_L1", "mas_L3")
ROW_OVERRIDES = {"single_grpo": ["policy.sharing=L0"], "mas_L1": ["policy.sharing=L1"],
                 "mas_L3": ["policy.sharing=L3"]}

# The model and the settings every cell shares. One torch thread: the machine is shared and the cells run one
# after the other; a cell's wall time is measured under that setting.
COMMON = ["model.kind=hf", "model.preset=smollm2-135m", "env.style=chat", "rollout.mode=tree",
          "algo.micro_batch_size=16", "algo.update_token_budget=2048", "algo.minibatches=2", "warmstart.enabled=true",
          "warmstart.batch_size=8", "warmstart.token_budget=2048", "warmstart.epochs=1", "eval.temperature=0.0",
          "train.threads=1", "train.tensorboard=false"]

# Each task's team cell (L1), over COMMON. Held-out problems: 50 in every cell. In the games the plan agent (the
# single agent's only role) answers a move list or a grid: its responses are capped far below the tool's programs.
TASKS: dict[str, list[str]] = {
    # configs/real/math_mas_L1.yaml, with 50 held-out problems (0.17 -> 0.80 on 30 there)
    "math": ["env.name=math", "env.kwargs.dataset=arithmetic", "env.kwargs.max_turns=2", "env.kwargs.timeout=2.0",
             "env.kwargs.dataset_kwargs={min_terms: 2, max_terms: 3, min_digits: 2, max_digits: 3}",
             "model.max_prompt_tokens=1024", "rollout.K=4", "rollout.problems_per_step=8",
             "rollout.temperature=1.0", "rollout.max_new_tokens=40", "algo.lr=1.0e-5", "warmstart.episodes=24",
             "warmstart.noise=0.3", "warmstart.lr=1.0e-4", "eval.problems=50", "eval.every=6", "train.steps=12",
             "train.checkpoint_every=6"],
    # 8x8 grids, walls 0.3, start and goal at least 8 moves apart: the best of 100 random fixed answers solves 10 %
    # of 200 held-out grids (7x7: 6-10 %; without min_moves 17-24 %: docs/results/real/journal.md). The expert's
    # program is 342 SmolLM2 tokens at most. 7x7 started the team at 0.74 and 0.58 (seeds 0, 1), above 0.6: the
    # start is set by the plan agent copying the tool's (right) proposal, and on 8x8 the proposals are longer and
    # copied less often (starts 0.32, 0.84, 0.84 at seeds 0-2, the tool right in 47-48 of 50 first turns at seeds
    # 0-1; still 0.67 in the mean). So 9x9 with start and goal at least 10 moves apart: the best of 100 fixed
    # answers solves 5 % of 200 held-out grids, the expert's program is at most 348 tokens and the longest shortest
    # path 24 moves, and the untrained team started at 0.56, 0.38, 0.62 (seeds 0-2; docs/results/real/journal.md,
    # "Plan-Path"). The warm start at lr 1e-3 (10 episodes, the default 20-step warm-up) was a coin toss (starts
    # 0.58, 0.66, 0.00); Sudoku's reliable one (12 episodes, lr 3e-4 over a 3-step warm-up) taught the program to
    # both seeds probed (0.72 and 0.60 in 3 turns), and the plan agent then changes the tool's right proposal in the
    # first turn (solved by turn 1: 0.16, 0.40; by turn 2: 0.52, 0.60), which RL can fix: so two turns. But in the
    # table's seed-1 cell that one epoch left the program unlearned (warm-start loss 0.34 against 0.26-0.28 where it
    # was learned; every held-out program a syntax error, start 0.00): so two epochs, as Sokoban's. RL: lr warm-up
    # over 4 optimizer steps as Sudoku's (below)
    "plan_path": ["env.name=plan_path", "env.kwargs={size: 9, wall_prob: 0.3, min_moves: 10, max_turns: 2, "
                  "tool_mode: code, timeout: 2.0}", "model.max_prompt_tokens=2048", "rollout.K=4",
                  "rollout.problems_per_step=4", "rollout.temperature=0.7", "rollout.max_new_tokens=380",
                  "rollout.per_agent={plan: {max_new_tokens: 48}}", "algo.lr=2.0e-5", "algo.warmup_steps=4",
                  "warmstart.episodes=12", "warmstart.epochs=2", "warmstart.noise=0.3",
                  "warmstart.lr=3.0e-4", "warmstart.warmup_steps=3", "eval.problems=50", "eval.every=0",
                  "train.steps=5", "train.checkpoint_every=1"],
    # 6x6 rooms with two boxes: the best fixed answer found solves 5 % of the held-out rooms (7x7 with one box:
    # 14 %; docs/results/real/journal.md, "Settings chosen before the first cells"). The expert's search program is
    # up to 490 tokens (628 with the dead-square pruning it had first; benchmarks/expert_program_tokens.py), so each
    # sampled program is long: few problems and steps, two turns. Warm start (seed 0, 20 held-out rooms;
    # docs/results/real/journal.md): one epoch of 24 episodes at lr 1e-3 under the default 20-step warm-up (10
    # optimizer steps, peak 0.15x lr) solved 0 (every program a syntax error); at the full 1e-3 (2-step warm-up)
    # with each demonstration weighted the same, 0 (empty answers); two epochs at lr 3e-4 over a 3-step warm-up (20
    # steps), 0.65 (the tool right in every first turn). RL: lr warm-up over 4 optimizer steps as Sudoku's (below)
    "sokoban": ["env.name=sokoban", "env.kwargs={size: 6, num_boxes: 2, max_turns: 2, tool_mode: code, "
                "timeout: 2.0}", "model.max_prompt_tokens=2048", "rollout.K=4", "rollout.problems_per_step=2",
                "rollout.temperature=0.7", "rollout.max_new_tokens=560",
                "rollout.per_agent={plan: {max_new_tokens: 48}}", "algo.lr=2.0e-5", "algo.warmup_steps=4",
                "warmstart.episodes=24", "warmstart.epochs=2", "warmstart.noise=0.3", "warmstart.lr=3.0e-4",
                "warmstart.warmup_steps=3", "eval.problems=50", "eval.every=0", "train.steps=3",
                "train.checkpoint_every=1"],
    # 4x4 grids, 6 holes; the tool agent writes a backtracking solver that prints the grid (the expert's: 339 tokens
    # at most). Warm start: 12 episodes (9 optimizer steps) at lr 1e-3 under the default 20-step warm-up (peak 0.15x
    # lr) gave starts of 0.00-0.88 by seed and order on 50 grids, a program barely learned; at lr 3e-4 over a 3-step
    # warm-up 0.95 and 0.85 (seeds 0, 1; 20 grids), at 1.5e-4 0.00 (the grid pasted wrong): the program is learned
    # or not, so a start at or below 0.6 is not a stable setting here, and the table takes the reliable one
    # (docs/results/real/journal.md, "Sudoku"). At a constant RL lr 2e-5 AdamW's first step broke the tool's
    # programs (per-role models: approx. KL 0.12 in that one update, every program failing from the second step);
    # over a 4-step lr warm-up the tool's was 0.001 and the tool's programs improved. Then five RL steps broke the
    # tool's program in one seed of each team row (0.90 -> 0.00, 0.82 -> 0.00): sampled at 0.7 a 300-token program
    # mostly crashes, and the std division turns the groups' small differences into full-size pushes. The tool
    # sampled at 0.3 with Dr. GRPO advantages (no std division) held at both seeds tried (L1 seed 0 0.96 -> 0.94,
    # L3 seed 1 0.82 -> 0.90), where each change alone broke one of them (journal, "Sudoku")
    "sudoku": ["env.name=sudoku", "env.kwargs={size: 4, holes: 6, max_turns: 3, tool_mode: code, timeout: 2.0}",
               "model.max_prompt_tokens=2048", "rollout.K=4", "rollout.problems_per_step=4",
               "rollout.temperature=0.7", "rollout.max_new_tokens=400",
               "rollout.per_agent={plan: {max_new_tokens: 80}}",
               "algo.std_normalize=false", "algo.lr=2.0e-5", "algo.warmup_steps=4",
               "warmstart.episodes=12", "warmstart.noise=0.3", "warmstart.lr=3.0e-4",
               "warmstart.warmup_steps=3", "eval.problems=50", "eval.every=0",
               "train.steps=5", "train.checkpoint_every=1"],
    # coder + unit tester on the generated stdin/stdout problems (atgrpo/envs/code_templates.py; the expert's
    # programs are up to 132 tokens, its tests 183). Warm start: 24 episodes at lr 1e-4 (4 optimizer steps) left
    # the coder ignoring stdin (0/20 held-out), at lr 1e-3 the shared model's tester wrote programs instead of
    # cases (1/20); 48 episodes at lr 1e-3 (9 steps) gave 3/20 with both roles in format (docs/results/real/journal.md)
    "code": ["env.name=code", "env.kwargs={dataset: generated, max_turns: 2, timeout: 2.0}",
             "model.max_prompt_tokens=2048", "rollout.K=4", "rollout.problems_per_step=4",
             "rollout.temperature=0.7", "rollout.max_new_tokens=200",
             "rollout.per_agent={coder: {max_new_tokens: 160}}", "algo.lr=2.0e-5", "warmstart.episodes=48",
             "warmstart.noise=0.3", "warmstart.lr=1.0e-3", "eval.problems=50", "eval.every=0", "train.steps=4",
             "train.checkpoint_every=2"],
}
# Settings of a task's team rows only (mas_L1, mas_L3): they name a role the single agent does not have.
TEAM_ONLY: dict[str, list[str]] = {"sudoku": ["rollout.per_agent.tool.temperature=0.3"]}
# The single agent's warm-start episodes and problems per step, as multiples of the team's: a team episode gives
# about twice the demonstrations and sampled responses of a one-role episode. Math is measured
# (configs/real/math_single_grpo.yaml: 72 episodes against 24, 28 problems against 8 gave 1344 sampled responses
# against the team's 1052); the others are this reasoning, to be checked against the cells' `samples`.
SINGLE_SCALE: dict[str, tuple[float, float]] = {"math": (3.0, 3.5), "plan_path": (2.0, 2.0),
                                                "sokoban": (2.0, 2.0), "sudoku": (2.0, 2.0), "code": (2.0, 2.0)}
CONFIG_DIR = os.path.join("configs", "real", "table")


class TableError(ConfigError):
    """An unknown task, row or seed in a selection; the message names the valid choices."""


@dataclass(frozen=True)
class Cell:
    """One run of the table: an RL row of a task, at one seed."""

    task: str
    row: str  # an RL row: single_grpo | mas_L1 | mas_L3
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task}/{self.row}/seed{self.seed}"


def _value(items: list[str], key: str) -> str | None:
    """The last value given to ``key`` in a list of ``key=value`` overrides."""
    found = None
    for item in items:
        k, _, v = item.partition("=")
        if k == key:
            found = v
    return found


def row_overrides(task: str, row: str) -> list[str]:
    """Every override of one RL row of a task (seed 0), in the order they apply: COMMON, the task, the row, and
    for the team its ``TEAM_ONLY`` settings, for the single agent its scaled warm start and problems per step."""
    items = COMMON + TASKS[task] + ROW_OVERRIDES[row]
    if row != "single_grpo":
        items = items + TEAM_ONLY.get(task, [])
    else:
        episodes, problems = SINGLE_SCALE[task]
        team_episodes = int(_value(items, "warmstart.episodes"))
        team_problems = int(_value(items, "rollout.problems_per_step"))
        items = items + [f"warmstart.episodes={round(team_episodes * episodes)}",
                         f"rollout.problems_per_step={round(team_problems * problems)}"]
    return items


def config_path(task: str, row: str, root: str = ".") -> str:
    return os.path.join(root, CONFIG_DIR, f"{task}_{row}.yaml")


def select(tasks: list[str] | None, rows: list[str] | None, seeds: list[int] | None) -> list[Cell]:
    """The cells of a selection, in table order (task, row, seed). A no-RL row selects the RL cell it is read
    from. Raises ``TableError`` for an unknown task or row, or a negative seed."""
    tasks = tasks or list(TASKS)
    rows = rows or list(ROWS)
    seeds = [0, 1] if seeds is None else seeds
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise TableError(f"unknown real-table task(s) {', '.join(bad)}; choose from: {', '.join(TASKS)}")
    bad = [r for r in rows if r not in ROWS]
    if bad:
        raise TableError(f"unknown real-table row(s) {', '.join(bad)}; choose from: {', '.join(ROWS)}")
    if any(s < 0 for s in seeds):
        raise TableError(f"seeds must be >= 0, got {seeds}")
    wanted = {NO_RL_SOURCE.get(r, r) for r in rows}
    return [Cell(t, r, s) for t in TASKS if t in tasks for r in RL_ROWS if r in wanted for s in sorted(set(seeds))]


def write_configs(directory: str = CONFIG_DIR) -> list[str]:
    """Write ``<task>_<row>.yaml`` for every task and RL row into ``directory``; returns the paths."""
    import yaml

    os.makedirs(directory, exist_ok=True)
    paths = []
    for task in TASKS:
        for row in RL_ROWS:
            data = overrides_tree(row_overrides(task, row))
            source = [k for k, v in NO_RL_SOURCE.items() if v == row]
            note = (f"# {task}, '{ROW_TITLES[row]}': one cell of `atgrpo bench real-table` (seed 0; add seed=N)."
                    + (f"\n# Its evaluation before RL is the row '{ROW_TITLES[source[0]]}'." if source else "")
                    + f"\n# Written by `python -m atgrpo.bench.real_table --write-configs {CONFIG_DIR}`; do not edit"
                    " by hand\n# (tests/test_real_table.py checks these files against atgrpo/bench/real_table.py).\n")
            path = os.path.join(directory, f"{task}_{row}.yaml")
            with open(path, "w") as f:
                f.write(note + yaml.safe_dump(data, sort_keys=False))
            paths.append(path)
    return paths


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-configs", metavar="DIR", required=True, help="write one config file per RL cell")
    print("\n".join(write_configs(ap.parse_args().write_configs)))
