"""What the report page embeds: run records (``atgrpo.runs``) turned into one JSON-able dict, within a size budget.

Every step's metrics are kept. Trees (rollouts/step_<N>.jsonl) are kept for a sample of the dumped steps: the
first, the last and evenly spaced ones between, as many as fit ``TREE_BUDGET`` bytes and at most
``MAX_TREE_STEPS`` (a step's embedded size is estimated from its file's size, scaled by the first step's ratio:
the page holds a node's prompt once, the file K times). Held-out episodes are kept up to ``TRANSCRIPT_BUDGET`` bytes. Texts longer than
``MAX_TEXT_CHARS`` are cut, with a note saying where the full text is. The page states every such choice.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..runs import Node, RunRecord
from ..trainer.metrics import flatten

TREE_BUDGET = 12_000_000  # bytes of rollout files per report (shared by its runs)
TRANSCRIPT_BUDGET = 4_000_000  # bytes of held-out episodes per report (shared by its runs)
MAX_TREE_STEPS = 25  # steps with trees per run
MAX_TEXT_CHARS = 20_000  # one prompt or response


def report_data(records: list[RunRecord], tree_budget: int = TREE_BUDGET,
                transcript_budget: int = TRANSCRIPT_BUDGET, max_tree_steps: int = MAX_TREE_STEPS) -> dict[str, Any]:
    """The page's data for these runs (several: overlaid, with their config differences)."""
    n = max(1, len(records))
    runs = [run_data(r, tree_budget // n, transcript_budget // n, max_tree_steps) for r in records]
    return clean({"runs": runs, "config_diff": config_diff([r.config for r in records]),
                  "agents": _all_agents(records),
                  "limits": {"max_text_chars": MAX_TEXT_CHARS, "max_tree_steps": max_tree_steps}})


def run_data(record: RunRecord, tree_budget: int, transcript_budget: int, max_tree_steps: int) -> dict[str, Any]:
    """One run: config, summary, metrics as columns, held-out success, sampled trees, held-out episodes."""
    steps = [r["step"] for r in record.metrics]
    names = record.metric_names()
    trees = {}
    if record.tree_steps:  # the first step's embedded size per byte of its file estimates every step's
        first = record.tree_steps[0]
        trees[first] = tree_data(record.trees(first), first)
        ratio = len(json.dumps(trees[first])) / max(1, _file_size(record, first))
        sizes = {s: int(_file_size(record, s) * ratio) for s in record.tree_steps}
        shown = pick_steps(record.tree_steps, sizes, tree_budget, max_tree_steps)
    else:
        shown = []
    for s in shown:
        if s not in trees:
            trees[s] = tree_data(record.trees(s), s)
    episodes, kept = fit_episodes(record.transcripts, transcript_budget)
    return {
        "name": record.name, "path": os.path.abspath(record.path), "finished": record.finished,
        "config": record.config, "summary": record.summary, "agents": record.agents,
        "total_steps": _total_steps(record),
        "metrics": {"steps": steps, "series": {k: [row.get(k) for row in record.metrics] for k in names}},
        "held_out": record.held_out(),
        "trees": {"dumped": record.tree_steps, "shown": shown,
                  "steps": {str(s): trees[s] for s in shown}},
        "transcripts": {"total": len(record.transcripts), "shown": kept, "episodes": episodes},
        "skipped_lines": record.skipped_lines,
    }


def tree_data(trees: dict[str, list[Node]], step: int) -> list[dict[str, Any]]:
    """A step's trees: per problem its nodes; per node the prompt once and the K candidates. ``prompt`` is set
    on a candidate only when it differs from the node's (trajectory mode)."""
    where = f"rollouts/step_{step}.jsonl"
    out = []
    for problem, nodes in trees.items():
        out.append({"problem": problem, "nodes": [{
            "turn": n.turn, "agent": n.agent, "prompt": cut(n.prompt, where),
            "cands": [{
                "branch": c.branch, "response": cut(c.response, where), "team": c.reward_team,
                "local": c.reward_local, "reward": c.reward, "advantage": c.advantage, "kept": c.selected,
                "finished": c.finished, "info": c.info, "policy": c.policy, "group": c.group,
                **({} if c.prompt == n.prompt else {"prompt": cut(c.prompt, where)})} for c in n.candidates],
        } for n in nodes]})
    return out


def pick_steps(dumped: list[int], sizes: dict[int, int], budget: int, max_steps: int) -> list[int]:
    """The most evenly spaced steps of ``dumped`` (first and last included) whose sizes fit ``budget``, at most
    ``max_steps``; at least the first step, whatever its size."""
    if not dumped:
        return []
    for n in range(min(max_steps, len(dumped)), 0, -1):
        chosen = evenly_spaced(dumped, n)
        if sum(sizes.get(s, 0) for s in chosen) <= budget or n == 1:
            return chosen
    return []


def evenly_spaced(items: list[int], n: int) -> list[int]:
    """``n`` items of a sorted list: the first, the last (n >= 2) and evenly spaced ones between."""
    if n >= len(items):
        return list(items)
    if n == 1:
        return [items[0]]
    return sorted({items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)})


def fit_episodes(episodes: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """The first episodes whose JSON fits ``budget`` bytes (texts cut to ``MAX_TEXT_CHARS``); (episodes, count)."""
    out, used = [], 0
    for ep in episodes:
        ep = {**ep, "transcript": [{**t, "prompt": cut(t.get("prompt", ""), "eval_transcripts.jsonl"),
                                    "response": cut(t.get("response", ""), "eval_transcripts.jsonl")}
                                   for t in ep.get("transcript", [])]}
        size = len(json.dumps(ep))
        if used + size > budget:
            break
        out.append(ep)
        used += size
    return out, len(out)


def config_diff(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dotted keys whose values differ between the configs: [{key, values: one per config}]."""
    if len(configs) < 2:
        return []
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat))
    missing = object()
    out = []
    for k in keys:
        vals = [f.get(k, missing) for f in flat]
        if any(v != vals[0] for v in vals[1:]):
            out.append({"key": k, "values": [None if v is missing else v for v in vals]})
    return out


def cut(text: Any, where: str) -> str:
    """``text`` as a string of at most ``MAX_TEXT_CHARS`` characters, with a note where it was cut."""
    text = text if isinstance(text, str) else json.dumps(text)
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n[... {len(text) - MAX_TEXT_CHARS} more characters: the full text is in {where}]"


def clean(x: Any) -> Any:
    """A copy that JSON can carry to the browser: non-finite floats become None (JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def _file_size(record: RunRecord, step: int) -> int:
    return os.path.getsize(os.path.join(record.path, "rollouts", f"step_{step}.jsonl"))


def _total_steps(record: RunRecord) -> int | None:
    steps = (record.config.get("train") or {}).get("steps")
    return steps if isinstance(steps, int) else None


def _all_agents(records: list[RunRecord]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        for a in r.agents:
            seen.setdefault(a, None)
    return list(seen)
