"""Read a run directory from Python: its config, summary, metrics per step, sampled trees and held-out transcripts.

The HTML report (``atgrpo report``) is built on this module, and a notebook can use it the same way::

    import atgrpo.runs
    run = atgrpo.runs.load("runs/20260101-120000-plan_path-L1")
    run.config["rollout"]["K"], run.summary["eval_after"]["success_rate"]
    steps, values = run.series("rollout/success_rate")
    for problem, nodes in run.trees(run.tree_steps[-1]).items():
        node = nodes[0]                 # the first (turn, agent) node of this problem
        node.prompt, node.kept.response, [c.advantage for c in node.candidates]

A run in progress can be read too: ``summary`` is None until the run ends, and a line being written at the
moment of reading (the last line of a JSON-lines file) is skipped. So is whatever a crash or a damaged disk
left unreadable: a torn or garbled line, a truncated summary.json or config.yaml; ``skipped_lines`` counts them
per file and ``skipped_note`` says so in one line. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["Candidate", "Node", "NotARunError", "RunRecord", "load"]

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


class NotARunError(ValueError):
    """The directory is not an atgrpo run directory (no config.yaml and no metrics.jsonl)."""


@dataclass(frozen=True)
class Candidate:
    """One of the K candidates of a (turn, agent) node: one line of rollouts/step_<N>.jsonl."""

    branch: int  # k in [0, K) (tree mode) or the trajectory index (trajectory mode)
    response: str
    reward_team: float
    reward_local: float
    reward: float  # alpha * reward_team + reward_local
    advantage: float
    selected: bool  # the kept candidate: its state became the node's successor (always True in trajectory mode)
    finished: bool  # the response ended with EOS (or a stop string)
    info: dict[str, Any]  # the environment's feedback on this candidate (parse result, program output, decision)
    policy: str
    group: str  # the advantage group (algo.group_key)
    prompt: str  # the prompt this candidate answered (the node's prompt in tree mode)
    temperature: float | None = None


@dataclass(frozen=True)
class Node:
    """A (problem, turn, agent) node of a step's tree: one prompt and its K candidates in branch order."""

    problem: str
    turn: int
    agent: str
    candidates: tuple[Candidate, ...]

    @property
    def prompt(self) -> str:
        """The node's prompt (tree mode: the one all K candidates answered)."""
        return self.candidates[0].prompt

    @property
    def same_prompt(self) -> bool:
        """All candidates answered the same prompt (tree mode); False in trajectory mode after the first turn."""
        return all(c.prompt == self.prompt for c in self.candidates)

    @property
    def kept(self) -> Candidate | None:
        """The kept candidate (the first selected one), or None if none was kept."""
        return next((c for c in self.candidates if c.selected), None)


@dataclass
class RunRecord:
    """What a run directory holds, read from its files (``load``). Trees are read on demand (``trees``)."""

    path: str
    config: dict[str, Any]  # config.yaml (the resolved config); {} if missing or unreadable
    summary: dict[str, Any] | None  # summary.json, None while the run is in progress
    metrics: list[dict[str, Any]]  # one merged row per step, in step order (metrics.jsonl)
    transcripts: list[dict[str, Any]]  # eval_transcripts.jsonl: the latest held-out evaluation's episodes
    tree_steps: list[int]  # the steps whose rollouts were dumped (rollouts/step_<N>.jsonl), ascending
    skipped_lines: dict[str, int] = field(default_factory=dict)  # file -> lines (or files) that were unreadable

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def agents(self) -> list[str]:
        """The roles in turn order (summary.json's agent -> policy map, else the order they act in the held-out
        transcripts), then any other role with a reward in the metrics."""
        seen: dict[str, None] = dict.fromkeys((self.summary or {}).get("agent_to_policy") or {})
        for ep in self.transcripts:
            for t in ep.get("transcript", []):
                seen.setdefault(str(t.get("agent", "?")), None)
        for row in self.metrics:
            for k in row:
                if k.startswith("rollout/reward/"):
                    seen.setdefault(k.split("/", 2)[2], None)
        return list(seen)

    def skipped_note(self) -> str | None:
        """One line naming what was skipped as unreadable (None: nothing), e.g. after a crash tore a line."""
        if not self.skipped_lines:
            return None
        what = ", ".join(f"{n} line(s) of {f}" if f.endswith(".jsonl") else f"{f} (unreadable)"
                         for f, n in sorted(self.skipped_lines.items()))
        return f"{self.path}: skipped what could not be read: {what}"

    def metric_names(self) -> list[str]:
        """Every metric name of any step, sorted."""
        return sorted({k for row in self.metrics for k in row if k != "step"})

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, for the steps that have it."""
        pts = [(r["step"], r[name]) for r in self.metrics if isinstance(r.get(name), (int, float))]
        return [s for s, _ in pts], [float(v) for _, v in pts]

    def held_out(self) -> list[tuple[int, float]]:
        """Held-out success rate by step: before training (step 0: summary.json's, or while the run is in its
        first steps, the success rate of the step-0 episodes of eval_transcripts.jsonl), at each evaluation."""
        out = []
        if self.summary and isinstance(self.summary.get("eval_before"), dict):
            out.append((0, float(self.summary["eval_before"]["success_rate"])))
        elif self.transcripts and all(t.get("step") == 0 for t in self.transcripts):
            out.append((0, sum(bool(t.get("success")) for t in self.transcripts) / len(self.transcripts)))
        steps, values = self.series("eval/success_rate")
        return out + list(zip(steps, values))

    def samples(self, step: int) -> list[dict[str, Any]]:
        """The raw lines of rollouts/step_<step>.jsonl (one per sampled response)."""
        if step not in self.tree_steps:
            raise KeyError(f"step {step} of {self.path} has no dumped rollouts; dumped steps: {self.tree_steps} "
                           f"(train.dump_rollouts chooses them)")
        rows, bad = read_jsonl(os.path.join(self.path, "rollouts", f"step_{step}.jsonl"))
        if bad:
            self.skipped_lines[f"rollouts/step_{step}.jsonl"] = bad
        return rows

    def trees(self, step: int) -> dict[str, list[Node]]:
        """The step's trees: problem id -> its (turn, agent) nodes in the order they were sampled."""
        return build_trees(self.samples(step))


def build_trees(samples: list[dict[str, Any]]) -> dict[str, list[Node]]:
    """Group sample lines into nodes by (problem, turn, agent), keeping the order of first appearance; the
    candidates of a node in branch order."""
    nodes: dict[tuple[str, int, str], list[Candidate]] = {}
    for s in samples:
        key = (str(s["problem"]), int(s["turn"]), str(s["agent"]))
        nodes.setdefault(key, []).append(Candidate(
            branch=int(s["branch"]), response=s.get("response", ""), reward_team=_num(s.get("reward_team")),
            reward_local=_num(s.get("reward_local")), reward=_num(s.get("reward")),
            advantage=_num(s.get("advantage")), selected=bool(s.get("selected")), finished=bool(s.get("finished")),
            info=dict(s.get("info") or {}), policy=str(s.get("policy", "")), group=str(s.get("group", "")),
            prompt=s.get("prompt", ""), temperature=s.get("temperature")))
    out: dict[str, list[Node]] = {}
    for (problem, turn, agent), cands in nodes.items():
        out.setdefault(problem, []).append(Node(problem, turn, agent, tuple(sorted(cands, key=lambda c: c.branch))))
    return out


def load(path: str) -> RunRecord:
    """Read the run directory ``path`` (finished or in progress). Raises ``NotARunError`` for a directory that
    holds no run and ``FileNotFoundError`` for a path that does not exist."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a directory" if os.path.exists(path) else f"{path} does not exist")
    has_config = os.path.isfile(os.path.join(path, "config.yaml"))
    if not has_config and not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        raise NotARunError(f"{path} is not an atgrpo run directory (no config.yaml or metrics.jsonl; "
                           f"`atgrpo train --out DIR` writes one)")
    skipped: dict[str, int] = {}
    config: dict[str, Any] = {}
    if has_config:
        try:
            with open(os.path.join(path, "config.yaml"), encoding="utf-8") as f:
                config = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            config = {}
        if not isinstance(config, dict):
            config = {}
        if not config:
            skipped["config.yaml"] = 1  # unreadable: the page says so
    summary = _read_json(os.path.join(path, "summary.json"))
    if os.path.exists(os.path.join(path, "summary.json")) and not isinstance(summary, dict):
        skipped["summary.json"] = 1  # truncated or garbled: the run reads as in progress
    rows, bad = read_jsonl(os.path.join(path, "metrics.jsonl"))
    if bad:
        skipped["metrics.jsonl"] = bad
    transcripts, bad = read_jsonl(os.path.join(path, "eval_transcripts.jsonl"))
    if bad:
        skipped["eval_transcripts.jsonl"] = bad
    return RunRecord(path=path, config=config, summary=summary if isinstance(summary, dict) else None,
                     metrics=merge_rows(rows), transcripts=transcripts, tree_steps=_dumped_steps(path),
                     skipped_lines=skipped)


def merge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step (the final evaluation is logged as a second row of the last step), in step order;
    a later value of a name replaces an earlier one."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        if isinstance(r.get("step"), int):
            by_step.setdefault(r["step"], {}).update(r)
    return [by_step[s] for s in sorted(by_step)]


def _dumped_steps(path: str) -> list[int]:
    d = os.path.join(path, "rollouts")
    if not os.path.isdir(d):
        return []
    return sorted(int(m.group(1)) for f in os.listdir(d) if (m := _STEP_FILE.fullmatch(f)))


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path: str) -> tuple[list[dict[str, Any]], int]:
    """(the JSON-object lines of ``path``, how many lines were not one); ([], 0) when there is no file."""
    if not os.path.isfile(path):
        return [], 0
    rows, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    return rows, bad


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
