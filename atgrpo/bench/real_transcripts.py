"""A real-table cell's held-out episodes to read: one solved and one failed, before RL and after it, as Markdown.

The run directories of the table (``runs_real/``) are not kept in the repository, so each finished cell also gets
``cells/<task>/<row>/seed<k>.md`` beside its result file: the first solved and the first failed episode (problem
order) of the evaluation before RL (``eval_transcripts_start.jsonl``, where the run kept it) and of the last one
(``eval_transcripts.jsonl``). Each turn shows the agent, the user message of its prompt (the system message repeats
the rules and is left out), its response and its rewards. A backfill for a run directory that is still there:

    python -m atgrpo.bench.real_transcripts runs_real/table/sokoban/mas_L1/seed1 \\
        docs/results/real/cells/sokoban/mas_L1/seed1.md --title "sokoban/mas_L1/seed1: held-out examples"
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..runs import read_jsonl

START_FILE, LAST_FILE = "eval_transcripts_start.jsonl", "eval_transcripts.jsonl"
_USER, _END = "<|im_start|>user\n", "<|im_end|>"
TAIL_CHARS = 1200  # a prompt in another chat template: its end, where the state is


def user_message(prompt: str) -> str:
    """The last user message of a prompt in the ChatML template (SmolLM2's, Qwen's); the prompt's last
    ``TAIL_CHARS`` characters in any other format."""
    at = prompt.rfind(_USER)
    if at < 0:
        return prompt[-TAIL_CHARS:]
    body = prompt[at + len(_USER):]
    end = body.find(_END)
    return body if end < 0 else body[:end]


def pick(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first solved and the first failed episode, in that order (either may be missing)."""
    solved = next((e for e in episodes if e.get("success")), None)
    failed = next((e for e in episodes if not e.get("success")), None)
    return [e for e in (solved, failed) if e is not None]


def _fence(text: str) -> str:
    """A fence longer than any backtick run in ``text``, so program blocks inside stay verbatim."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def episode_markdown(episode: dict[str, Any]) -> str:
    """One episode: its problem and outcome, then each turn's user message, response and rewards."""
    verdict = "solved" if episode.get("success") else "failed"
    lines = [f"#### {episode.get('problem', '?')}: {verdict} (step {episode.get('step', '?')})", ""]
    for t in episode.get("transcript", []):
        local, team = t.get("local"), t.get("team")
        rewards = f"local {local:+.2f}, team {team:+.2f}" if local is not None and team is not None else ""
        lines.append(f"**turn {t.get('turn', 0) + 1}, {t.get('agent', '?')}** ({rewards})".replace(" ()", ""))
        for label, text in (("prompt (user message)", user_message(t.get("prompt", ""))),
                            ("response", t.get("response", ""))):
            fence = _fence(text)
            lines += ["", f"{label}:", "", fence + "text", text.strip("\n"), fence, ""]
    return "\n".join(lines)


def cell_markdown(run_dir: str, title: str) -> str | None:
    """The Markdown page of a run directory's examples; None when it has no held-out transcripts."""
    sections = []
    start, last = (read_jsonl(os.path.join(run_dir, name))[0] for name in (START_FILE, LAST_FILE))
    if start and last and start[0].get("step") == last[0].get("step"):
        start = []  # no RL step ran: the last evaluation is the start
    for name, episodes in (("Before RL", start), ("After RL" if start else "Last evaluation", last)):
        if not episodes:
            continue
        solved = sum(bool(e.get("success")) for e in episodes)
        sections.append(f"### {name}: {solved} of {len(episodes)} held-out episodes solved\n")
        sections += [episode_markdown(e) for e in pick(episodes)]
    if not sections:
        return None
    files = ", ".join(name for name, eps in ((START_FILE, start), (LAST_FILE, last)) if eps)
    return f"## {title}\n\nFrom `{run_dir}` ({files}).\n\n" + "\n".join(sections)


def write_cell_transcripts(run_dir: str, path: str, title: str) -> bool:
    """Write ``cell_markdown`` to ``path``; False (nothing written) when the run has no transcripts."""
    from ..trainer.atomic_files import atomic_write_text

    text = cell_markdown(run_dir, title)
    if text is None:
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_text(path, text)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--title", help="the page's heading (default: the run directory)")
    args = ap.parse_args()
    if not write_cell_transcripts(args.run_dir, args.out, args.title or os.path.normpath(args.run_dir)):
        raise SystemExit(f"no {LAST_FILE} in {args.run_dir}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
