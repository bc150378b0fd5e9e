"""Does the scripted code-mode expert solve the games through the sandbox? (``atgrpo bench experts``)

For each game, on held-out (evaluation-split) instances with chat prompts and ``tool_mode="code"``: the
scripted tool agent writes its program (``expert_programs``: a BFS, a Sokoban search, a Sudoku solver, the
instance copied from the prompt into the program); the environment runs it in the sandbox (result cache
cleared first, so every run is real); the last printed line is then executed as the plan agent's answer on a
clone. ``solved`` = that executed answer solves the instance, i.e. the program alone solved it. The env
settings are those of the chat code-mode configs (``configs/<game>_chat_code.yaml``, checked by the tests).

    atgrpo bench experts --problems 50 --out bench_out
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..envs import make
from ..envs.programs import clear_cache

GAMES: dict[str, dict[str, Any]] = {  # the env kwargs of configs/<game>_chat_code.yaml
    "plan_path": {"size": 10, "wall_prob": 0.22, "max_turns": 4, "tool_mode": "code", "timeout": 2.0},
    "sokoban": {"size": 6, "num_boxes": 1, "max_turns": 4, "tool_mode": "code", "timeout": 2.0},
    "sudoku": {"size": 4, "max_turns": 4, "tool_mode": "code", "timeout": 2.0},
}


def expert_program_outcomes(game: str, problems: int, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the code-mode expert's first program on ``problems`` held-out instances of ``game``: how many it
    solves (its printed answer executed), how many crash or time out, and the mean seconds per run."""
    env = make(game, style="chat", split="eval", **(kwargs if kwargs is not None else GAMES[game]))
    clear_cache()
    solved = crashed = timed_out = 0
    seconds = 0.0
    for seed in range(problems):
        env.reset(seed)
        t0 = time.perf_counter()
        env.step(env.expert_action("tool"))
        seconds += time.perf_counter() - t0
        run = env.tool_run
        crashed += run.crashed
        timed_out += run.timed_out
        twin = env.clone()
        twin.step(run.answer or "")
        solved += twin.success
    return {"game": game, "problems": problems, "solved": solved, "solve_rate": solved / max(1, problems),
            "crashed": crashed, "timed_out": timed_out, "seconds_per_run": seconds / max(1, problems)}


def expert_program_tokens(config: Any, problems: int) -> list[int]:
    """The lengths, in ``config``'s model's tokens (a loaded chat code-mode ``Config``), of the expert's
    programs on ``problems`` held-out instances of its env: what a warm-started model must learn to write and
    what ``rollout.max_new_tokens`` must hold."""
    from transformers import AutoTokenizer

    from ..policies.hf import resolve_model_dir
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(config.model), local_files_only=True)
    env = make(config.env.name, style="chat", split="eval", **config.env.kwargs)
    lengths = []
    for seed in range(problems):
        env.reset(seed)
        lengths.append(len(tok(env.expert_program())["input_ids"]))
    return lengths


def bench_experts(problems: int, games: list[str] | None, out: str) -> list[dict[str, Any]]:
    """All games (or ``games``); writes ``experts.json`` and ``experts.md`` under ``out``."""
    from ..config import ConfigError

    unknown = sorted(set(games or []) - set(GAMES))
    if unknown:
        raise ConfigError(f"unknown experts-bench game(s) {', '.join(unknown)}; choose from: {', '.join(GAMES)}")
    rows = [expert_program_outcomes(g, problems) for g in (games or list(GAMES))]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "experts.json"), "w") as f:
        json.dump({"command": f"atgrpo bench experts --problems {problems} --out {out}", "rows": rows}, f, indent=1)
    lines = ["| game | held-out instances | solved by the program | crashed | timed out | s per run |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['game']} | {r['problems']} | {r['solved']} ({r['solve_rate']:.0%}) | {r['crashed']} | "
              f"{r['timed_out']} | {r['seconds_per_run']:.3f} |" for r in rows]
    with open(os.path.join(out, "experts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows
