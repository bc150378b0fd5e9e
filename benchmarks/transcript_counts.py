"""Counts read from a run directory's transcripts: what an agent did before and after RL, and what it sampled.

For the held-out evaluations (``eval_transcripts_start.jsonl``, before RL; ``eval_transcripts.jsonl``, after):
episodes solved, each agent's turns by local reward, and how many of an agent's second turns repeat its first
word for word (a coder that does not revise); in the move games (Plan-Path, Sokoban), how often the plan agent's
first answer copies the tool's proposal (its last line's moves equal the proposed list), by the proposal's length
(the habit that sets these teams' start). For each dumped rollout step (``rollouts/step_<n>.jsonl``): each
agent's samples by reward, its groups, how many groups hold one distinct response only (no gradient), and the
programs' errors (the last line of a sample's stderr, for tool agents that run code).
docs/results/real/journal.md quotes these counts for the real-model table's cells.

    python benchmarks/transcript_counts.py runs_real/table/code/mas_L3/seed0
    python benchmarks/transcript_counts.py runs_real/diag/sudoku_nostd_t03_s0 --agent tool
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections import Counter, defaultdict
from typing import Any

from atgrpo.runs import read_jsonl

EVAL_FILES = {"before": "eval_transcripts_start.jsonl", "after": "eval_transcripts.jsonl"}
PROPOSED = re.compile(r"proposed \[([^\]]*)\]")  # the move games' plan prompt: "Tool agent proposed [R, D]; ..."
MOVE = re.compile(r"[UDLR]")


def plan_copies(episodes: list[dict[str, Any]]) -> dict[str, str]:
    """Per proposal length (moves), "copies of first turns": the first-turn plan answers whose last non-empty
    line spells the tool's proposed moves; empty where no plan prompt shows a proposal (not a move game)."""
    by_length: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for episode in episodes:
        for turn in episode["transcript"]:
            first_plan = turn.get("turn") == 0 and turn["agent"] == "plan"
            match = PROPOSED.search(turn.get("prompt", "")) if first_plan else None
            if match:
                proposed = MOVE.findall(match.group(1))
                lines = [line for line in turn["response"].splitlines() if line.strip()]
                counts = by_length[len(proposed)]
                counts[1] += 1
                counts[0] += bool(lines) and MOVE.findall(lines[-1]) == proposed
    return {str(n): f"{same} of {seen}" for n, (same, seen) in sorted(by_length.items())}


def eval_counts(episodes: list[dict[str, Any]], agent: str | None) -> dict[str, Any]:
    """Solved episodes; per agent its turns by local reward and its second turns equal to its first."""
    by_reward: dict[str, Counter] = defaultdict(Counter)
    repeats: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # [second turn verbatim, episodes with two]
    for episode in episodes:
        responses: dict[str, list[str]] = defaultdict(list)
        for turn in episode["transcript"]:
            if agent in (None, turn["agent"]):
                by_reward[turn["agent"]][round(float(turn["local"]), 2)] += 1
                responses[turn["agent"]].append(turn["response"])
        for name, said in responses.items():
            if len(said) >= 2:
                repeats[name][1] += 1
                repeats[name][0] += said[0] == said[1]
    return {"episodes": len(episodes), "solved": sum(bool(e["success"]) for e in episodes),
            "turns_by_local_reward": {a: dict(sorted(c.items())) for a, c in by_reward.items()},
            "second_turn_verbatim": {a: f"{same} of {two}" for a, (same, two) in repeats.items()},
            "plan_copies_by_proposal_length": plan_copies(episodes)}


def rollout_counts(samples: list[dict[str, Any]], agent: str | None) -> dict[str, Any]:
    """Per agent: its samples by reward, its groups, the groups whose K responses are all one text, and the last
    stderr lines of its programs, most frequent first."""
    by_reward: dict[str, Counter] = defaultdict(Counter)
    errors: dict[str, Counter] = defaultdict(Counter)
    groups: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for s in samples:
        if agent in (None, s["agent"]):
            by_reward[s["agent"]][round(float(s["reward"]), 2)] += 1
            groups[s["agent"]][str(s["group"])].add(s["response"])
            stderr = [line for line in str((s.get("info") or {}).get("stderr") or "").splitlines() if line.strip()]
            if stderr:
                errors[s["agent"]][stderr[-1].strip()] += 1
    return {a: {"samples_by_reward": dict(sorted(by_reward[a].items())), "groups": len(g),
                "groups_one_response": sum(len(texts) == 1 for texts in g.values()),
                "errors": dict(errors[a].most_common())} for a, g in groups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--agent", help="only this agent's turns and samples")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for when, name in EVAL_FILES.items():
        episodes, _ = read_jsonl(os.path.join(args.run_dir, name))
        if episodes:
            out[f"eval_{when}"] = eval_counts(episodes, args.agent)
    step_files = glob.glob(os.path.join(args.run_dir, "rollouts", "step_*.jsonl"))
    for path in sorted(step_files, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0])):
        samples, _ = read_jsonl(path)
        out[os.path.basename(path)[:-len(".jsonl")]] = rollout_counts(samples, args.agent)
    if not out:
        raise SystemExit(f"{args.run_dir}: no eval_transcripts*.jsonl and no rollouts/step_*.jsonl")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
