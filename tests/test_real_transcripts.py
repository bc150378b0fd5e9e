"""The real table's example pages (atgrpo/bench/real_transcripts.py): which episodes are picked, how a prompt is
cut to its user message, and a real run keeping its evaluation before RL beside the latest one."""

from __future__ import annotations

import json
import os

import atgrpo
from atgrpo.bench.real_transcripts import (LAST_FILE, START_FILE, TAIL_CHARS, cell_markdown, episode_markdown, pick,
                                           user_message, write_cell_transcripts)

from conftest import FAST


def _episode(problem, success, step=0, response="RRDL"):
    return {"problem": problem, "success": success, "step": step,
            "transcript": [{"turn": 0, "agent": "tool", "prompt": "<|im_start|>system\nrules<|im_end|>\n"
                            "<|im_start|>user\nGrid:\n#A_#<|im_end|>\n<|im_start|>assistant\n",
                            "response": response, "reward": 1.0, "team": 1.0, "local": 0.5}]}


def _write(path, episodes):
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episodes)


def test_the_user_message_is_cut_from_a_chatml_prompt_and_other_prompts_keep_their_end():
    prompt = "<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\nok" \
             "<|im_end|>\n<|im_start|>user\nTurn 2.\nGrid:\n#A#<|im_end|>\n<|im_start|>assistant\n"
    assert user_message(prompt) == "Turn 2.\nGrid:\n#A#"
    compact = "x" * 5000 + "P1 E3\n#A_#\n>"
    assert user_message(compact) == compact[-TAIL_CHARS:] and user_message(compact).endswith("#A_#\n>")


def test_pick_takes_the_first_solved_then_the_first_failed_episode():
    eps = [_episode("p/0", False), _episode("p/1", True), _episode("p/2", False), _episode("p/3", True)]
    assert [e["problem"] for e in pick(eps)] == ["p/1", "p/0"]
    assert [e["problem"] for e in pick(eps[1:2])] == ["p/1"] and pick([]) == []


def test_a_response_holding_a_code_block_stays_verbatim_inside_a_longer_fence():
    text = episode_markdown(_episode("p/0", True, response="```python\nprint('RRDL')\n```"))
    assert "````text\n```python\nprint('RRDL')\n```\n````" in text
    assert "**turn 1, tool** (local +0.50, team +1.00)" in text and "Grid:\n#A_#" in text and "rules" not in text


def test_the_page_shows_before_and_after_rl_with_their_counts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / START_FILE, [_episode("p/0", False), _episode("p/1", False)])
    _write(run / LAST_FILE, [_episode("p/0", True, step=3), _episode("p/1", False, step=3)])
    page = cell_markdown(str(run), "math/mas_L1/seed0")
    assert page.startswith("## math/mas_L1/seed0")
    before, after = page.split("### After RL: 1 of 2 held-out episodes solved")
    assert "### Before RL: 0 of 2 held-out episodes solved" in before and "solved (step" not in before
    assert "#### p/0: solved (step 3)" in after and "#### p/1: failed (step 3)" in after


def test_a_run_without_rl_steps_or_without_transcripts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert cell_markdown(str(run), "t") is None and not write_cell_transcripts(str(run), str(tmp_path / "t.md"), "t")
    _write(run / START_FILE, [_episode("p/0", True)])
    _write(run / LAST_FILE, [_episode("p/0", True)])  # train.steps=0: the one evaluation is both files
    page = cell_markdown(str(run), "t")
    assert "Before RL" not in page and "### Last evaluation: 1 of 1" in page
    os.remove(run / START_FILE)  # a run from before the start file existed: the page names only what it read
    assert f"({LAST_FILE})." in cell_markdown(str(run), "t") and START_FILE not in cell_markdown(str(run), "t")


def test_a_real_run_keeps_its_evaluation_before_rl(tmp_path):
    """A tiny two-step run: the step-0 evaluation stays in eval_transcripts_start.jsonl after the final one
    replaces eval_transcripts.jsonl, and the page written from the run counts each."""
    out = str(tmp_path / "run")
    atgrpo.train(None, FAST, out=out, progress=False)

    def lines(name):
        with open(os.path.join(out, name)) as f:
            return [json.loads(line) for line in f]

    start, last = lines(START_FILE), lines(LAST_FILE)
    assert {e["step"] for e in start} == {0} and {e["step"] for e in last} == {2} and len(start) == len(last) == 6
    assert write_cell_transcripts(out, str(tmp_path / "cell.md"), "tiny")
    page = (tmp_path / "cell.md").read_text()
    for name, episodes in (("Before RL", start), ("After RL", last)):
        assert f"### {name}: {sum(e['success'] for e in episodes)} of 6 held-out episodes solved" in page
