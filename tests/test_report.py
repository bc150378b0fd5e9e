"""The run reader (atgrpo.runs), the HTML report (atgrpo report) and atgrpo.train(): the data the page embeds is
checked against the run's own files, the size stays bounded for a 1000-step run, and a real headless Chromium
opens the page, clicks a tree node and takes a screenshot that is not blank."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections import defaultdict

import pytest
import yaml

import atgrpo
from atgrpo import runs
from atgrpo.cli import main
from atgrpo.report import embedded_data, write_report
from atgrpo.report.browser import Browser, find_chromium, file_url
from atgrpo.report.data import config_diff, evenly_spaced, pick_steps

from conftest import FAST

STEPS = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real three-step run (tiny model), every step's rollouts dumped, a held-out evaluation at step 2."""
    out = str(tmp_path_factory.mktemp("report") / "run")
    summary = atgrpo.train(None, FAST + [f"train.steps={STEPS}", "eval.every=2", "train.dump_rollouts=[1,2,3]"],
                           out=out, progress=False)
    assert summary["steps"] == STEPS and "eval_after" in summary  # the summary comes back to the caller
    return out


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _page(path):
    with open(path) as f:
        return embedded_data(f.read())


def test_a_run_writes_its_report_and_every_held_out_episode(run_dir):
    assert os.path.isfile(os.path.join(run_dir, "report.html"))
    episodes = _lines(os.path.join(run_dir, "eval_transcripts.jsonl"))
    problems = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))["eval"]["problems"]
    assert len(episodes) == problems and {e["step"] for e in episodes} == {STEPS}


def test_embedded_trees_are_the_rollout_files(run_dir):
    """Each node's K candidates, their team / local rewards and advantages, and the kept one, as in
    rollouts/step_N.jsonl, grouped by hand here."""
    data = _page(os.path.join(run_dir, "report.html"))
    (run,) = data["runs"]
    k = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))["rollout"]["K"]
    assert run["trees"]["dumped"] == run["trees"]["shown"] == [1, 2, 3]
    for step in (1, 2, 3):
        nodes = defaultdict(list)
        for s in _lines(os.path.join(run_dir, "rollouts", f"step_{step}.jsonl")):
            nodes[(s["problem"], s["turn"], s["agent"])].append(s)
        embedded = {(p["problem"], n["turn"], n["agent"]): n for p in run["trees"]["steps"][str(step)]
                    for n in p["nodes"]}
        assert embedded.keys() == nodes.keys()
        for key, samples in nodes.items():
            node = embedded[key]
            samples.sort(key=lambda s: s["branch"])
            assert len(node["cands"]) == len(samples) == k
            assert {s["prompt"] for s in samples} == {node["prompt"]}  # tree mode: the prompt once
            for c, s in zip(node["cands"], samples):
                assert (c["branch"], c["response"], c["team"], c["local"], c["reward"], c["advantage"], c["kept"],
                        c["info"]) == (s["branch"], s["response"], s["reward_team"], s["reward_local"],
                                       s["reward"], s["advantage"], s["selected"], s["info"])
            assert sum(c["kept"] for c in node["cands"]) == 1
            kept = next(c for c in node["cands"] if c["kept"])
            assert kept["reward"] == max(c["reward"] for c in node["cands"])  # the best is kept


def test_embedded_metrics_transcripts_and_summary_are_the_run_files(run_dir):
    (run,) = _page(os.path.join(run_dir, "report.html"))["runs"]
    rows = _lines(os.path.join(run_dir, "metrics.jsonl"))
    cols = run["metrics"]
    assert cols["steps"] == [1, 2, 3]
    for row in rows:  # the last step has two rows: its training metrics, then the final evaluation
        i = cols["steps"].index(row["step"])
        for name, value in row.items():
            if name != "step":
                assert cols["series"][name][i] == value, name
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert run["summary"] == summary and run["finished"]
    assert run["held_out"] == [[0, summary["eval_before"]["success_rate"]],
                               [2, rows[1]["eval/success_rate"]], [3, summary["eval_after"]["success_rate"]]]
    assert run["transcripts"]["episodes"] == _lines(os.path.join(run_dir, "eval_transcripts.jsonl"))
    assert run["agents"] == ["tool", "plan"]


def test_reader(run_dir):
    r = runs.load(run_dir)
    assert r.tree_steps == [1, 2, 3] and r.finished and r.config["train"]["steps"] == STEPS
    steps, values = r.series("rollout/success_rate")
    assert steps == [1, 2, 3] and all(0 <= v <= 1 for v in values)
    trees = r.trees(2)
    first = _lines(os.path.join(run_dir, "rollouts", "step_2.jsonl"))[0]
    node = trees[first["problem"]][0]
    assert (node.turn, node.agent, node.prompt) == (first["turn"], first["agent"], first["prompt"])
    assert node.kept is not None and node.kept.selected and node.same_prompt
    with pytest.raises(KeyError, match="dumped steps"):
        r.trees(7)


def test_in_progress_run_and_several_runs(run_dir, tmp_path):
    """A run without summary.json reads as in progress; two runs are overlaid with their config differences."""
    other = str(tmp_path / "other")
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("checkpoint", "report.html"))
    os.remove(os.path.join(other, "summary.json"))
    cfg = yaml.safe_load(open(os.path.join(other, "config.yaml")))
    cfg["algo"]["alpha"] = 0.5
    yaml.safe_dump(cfg, open(os.path.join(other, "config.yaml"), "w"))
    assert not runs.load(other).finished and runs.load(other).held_out()[0][0] == 2  # no step 0 without summary
    episodes = _lines(os.path.join(other, "eval_transcripts.jsonl"))
    with open(os.path.join(other, "eval_transcripts.jsonl"), "w") as f:  # as after the evaluation before training
        f.writelines(json.dumps({**e, "step": 0}) + "\n" for e in episodes)
    assert runs.load(other).held_out()[0] == (0, sum(e["success"] for e in episodes) / len(episodes))
    with open(os.path.join(other, "metrics.jsonl"), "a") as f:
        f.write('{"step": 4, "loss/pg": 0.')  # a line being written while the report reads
    partial = runs.load(other)
    assert partial.skipped_lines == {"metrics.jsonl": 1} and [r["step"] for r in partial.metrics] == [1, 2, 3]
    out = write_report([run_dir, other], str(tmp_path / "both.html"))
    data = _page(out)
    assert [r["name"] for r in data["runs"]] == ["run", "other"]
    assert data["config_diff"] == [{"key": "algo.alpha", "values": [1.0, 0.5]}]
    assert config_diff([{"a": {"b": 1}}, {"a": {"b": 1}, "c": 2}]) == [{"key": "c", "values": [None, 2]}]


def test_report_cli_and_a_directory_that_is_not_a_run(run_dir, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "r.html")
    assert main(["report", run_dir, "--out", out]) == 0
    assert "report: " + out in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not an atgrpo run directory" in err[0]
    monkeypatch.setenv("ATGRPO_CHROMIUM", "no-such-browser")
    assert main(["report", run_dir, "--out", out, "--screenshot", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Chromium found" in err[0]


def test_step_sample_first_last_evenly_spaced_within_budget():
    steps = list(range(1, 1001))
    assert evenly_spaced(steps, 5) == [1, 251, 501, 750, 1000]  # round(i * 999 / 4) + 1
    assert pick_steps(steps, {s: 100 for s in steps}, budget=1000, max_steps=25) == evenly_spaced(steps, 10)
    assert pick_steps(steps, {s: 100 for s in steps}, budget=10 ** 9, max_steps=25) == evenly_spaced(steps, 25)
    assert pick_steps(steps, {s: 10 ** 9 for s in steps}, budget=1000, max_steps=25) == [1]  # the first, always


def _synthetic_run(root, run_dir, n_steps):
    """A 1000-step run directory of realistic size: the real run's metric names on every step, every step's
    rollouts dumped (one chat-sized step file, hard-linked), 200 held-out episodes with long texts."""
    d = os.path.join(root, "long")
    os.makedirs(os.path.join(d, "rollouts"))
    shutil.copy(os.path.join(run_dir, "config.yaml"), d)
    row = _lines(os.path.join(run_dir, "metrics.jsonl"))[0]
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step in range(1, n_steps + 1):
            f.write(json.dumps({**{k: v * (1 + step / 7e3) for k, v in row.items()}, "step": step}) + "\n")
    prompt, response = "You are the tool agent. " + "x" * 2000, "```python\n" + "print(1)\n" * 150 + "```"
    samples = [{"problem": f"p/{p}", "branch": b, "turn": t, "agent": a, "policy": "shared", "prompt": prompt + a,
                "response": response, "reward_team": 0.0, "reward_local": 0.5, "reward": 0.5, "selected": b == 0,
                "finished": True, "info": {"stdout": "1\n" * 100}, "group": f"p/{p}/{t}/{a}", "advantage": 0.1}
               for p in range(16) for t in range(3) for a in ("tool", "plan") for b in range(8)]
    first = os.path.join(d, "rollouts", "step_1.jsonl")
    with open(first, "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    for step in range(2, n_steps + 1):
        os.link(first, os.path.join(d, "rollouts", f"step_{step}.jsonl"))
    episode = {"problem": "p", "success": True, "step": n_steps,
               "transcript": [{"turn": t, "agent": "tool", "prompt": prompt, "response": response, "reward": 1.0}
                              for t in range(3)]}
    with open(os.path.join(d, "eval_transcripts.jsonl"), "w") as f:
        f.writelines(json.dumps(episode) + "\n" for _ in range(200))
    return d, os.path.getsize(first)


def test_report_of_a_1000_step_run_stays_under_20_mb(run_dir, tmp_path):
    d, step_bytes = _synthetic_run(str(tmp_path), run_dir, 1000)
    out = write_report(d)
    size = os.path.getsize(out)
    data = _page(out)
    (run,) = data["runs"]
    print(f"\n1000-step synthetic run ({step_bytes / 1e6:.2f} MB of rollouts per step): report {size / 1e6:.1f} MB, "
          f"trees of {len(run['trees']['shown'])} steps")
    assert size < 20e6, size
    assert len(run["metrics"]["steps"]) == 1000  # every step's numbers
    shown = run["trees"]["shown"]
    assert shown[0] == 1 and shown[-1] == 1000 and 2 <= len(shown) < 1000  # a sample of the trees
    assert shown == evenly_spaced(list(range(1, 1001)), len(shown))
    assert sum(len(json.dumps(t)) for t in run["trees"]["steps"].values()) <= 12e6  # the tree budget


def _not_blank(png: bytes) -> bool:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    lo, hi = img.getextrema()
    return hi - lo > 100 and len(img.resize((200, 150)).getcolors(maxcolors=256 * 256)) > 20


NO_CHROMIUM = pytest.mark.skipif(find_chromium() is None, reason="no Chromium on this machine (.ci/run installs "
                                                               "Debian's `chromium`; or set ATGRPO_CHROMIUM)")


@NO_CHROMIUM
def test_chromium_opens_the_report_clicks_a_node_and_draws_it(run_dir, tmp_path):
    data = _page(os.path.join(run_dir, "report.html"))
    node = data["runs"][0]["trees"]["steps"]["1"][0]["nodes"][1]
    with Browser() as b:
        b.open(file_url(os.path.join(run_dir, "report.html")))
        assert b.evaluate("document.querySelectorAll('.chart svg polyline').length") >= 10
        b.click("#tab-trees")
        b.wait_for("document.querySelector('#node-path a[data-node=\"1\"]')")
        b.click('#node-path a[data-node="1"]')  # the second node of the first problem of step 1
        # the first node's detail is drawn before the click: wait until the clicked node's has replaced it
        title = f"turn {node['turn']} \u00b7 {node['agent']} \u00b7"
        b.wait_for("location.hash === '#trees/0/1/0/1' && document.querySelector('#node-detail h3') && "
                   f"document.querySelector('#node-detail h3').textContent.indexOf({json.dumps(title)}) === 0")
        shown = b.evaluate("Array.from(document.querySelectorAll('#node-detail tr.cand')).map(function (r) {"
                           " return [+r.dataset.branch, r.classList.contains('kept')]; })")
        assert shown == [[c["branch"], c["kept"]] for c in node["cands"]]
        assert node["agent"] in b.evaluate("document.querySelector('#node-detail h3').textContent")
        png = b.screenshot()
        b.click("#tab-transcripts")
        b.wait_for("document.querySelector('#episodes')")
        b.evaluate("var f = document.querySelector('#tx-filter'); f.value = 'failure';"
                   " f.dispatchEvent(new Event('change'))")
        n_fail = sum(not e["success"] for e in data["runs"][0]["transcripts"]["episodes"])
        assert b.wait_for(f"document.querySelectorAll('#episodes .episode').length === {n_fail} "
                          "&& location.hash === '#transcripts/0/failure'")
        assert b.log.errors == [] and b.log.requests == []
        assert b.evaluate("document.getElementById('errors').hidden")
    assert _not_blank(png)
    (tmp_path / "node.png").write_bytes(png)


@NO_CHROMIUM
def test_report_cli_screenshot_of_a_node(run_dir, tmp_path, capsys):
    png = tmp_path / "node.png"
    assert main(["report", run_dir, "--out", str(tmp_path / "r.html"), "--screenshot", str(png),
                 "--view", "trees/0/3/1/1"]) == 0
    assert capsys.readouterr().err == "" and _not_blank(png.read_bytes())
