"""End-to-end: the CLI trains two steps, parameters change, outputs exist, and runs are reproducible."""

import json
import os

import torch
import yaml

from atgrpo.cli import main
from atgrpo.config import load_config
from atgrpo.trainer.evaluate import load_policies
from atgrpo.trainer.state import build_state


def _run(tmp_path, name, overrides):
    out = tmp_path / name
    assert main(["train", *overrides, "--out", str(out), "--quiet"]) == 0
    return out


def test_two_step_cli_run_changes_parameters_and_writes_outputs(tmp_path, fast_overrides):
    out = _run(tmp_path, "run", fast_overrides + ["warmstart.enabled=false", "policy.sharing=L3"])
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "rollouts/step_1.jsonl", "rollouts/step_2.jsonl"):
        assert (out / f).exists(), f
    summary = json.loads((out / "summary.json").read_text())
    for k in ("eval_before", "eval_after", "steps", "wall_seconds"):
        assert k in summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows[:2]] == [1, 2]
    for key in ("rollout/reward/tool", "rollout/reward_team/plan", "rollout/reward_local/plan", "loss/clipfrac",
                "loss/approx_kl", "group/zero_variance_frac", "perf/tokens_per_s", "time/rollout"):
        assert key in rows[0], key
    if os.path.exists("/proc/self/status"):  # each phase's peak resident memory (Linux), in the metrics and summary
        assert all(rows[0][f"perf/peak_rss_mb/{p}"] > 50 for p in ("rollout", "update"))
        peaks = summary["peak_rss_mb"]
        assert set(peaks) == {"eval_before", "eval_after", "process"}  # no warm start here
        assert peaks["process"] >= max(rows[0][f"perf/peak_rss_mb/{p}"] for p in ("rollout", "update"))
    # the trained weights differ from the initial weights of the same seed, for both per-role policies
    cfg = load_config(str(out / "config.yaml"))
    fresh, trained = build_state(cfg), build_state(cfg)
    load_policies(trained, str(out / "checkpoint" / "final"))
    assert set(fresh.policies) == {"tool", "plan"}
    for pid in fresh.policies:
        a = dict(fresh.policies[pid].model.named_parameters())
        b = dict(trained.policies[pid].model.named_parameters())
        changed = [n for n in a if not torch.equal(a[n], b[n])]
        assert changed, f"policy {pid}: no parameter changed"


def test_dumped_groups_have_k_members_with_identical_prompts(tmp_path, fast_overrides):
    out = _run(tmp_path, "run", fast_overrides)
    rows = [json.loads(line) for line in (out / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    groups = {}
    for r in rows:
        for k in ("problem", "branch", "turn", "agent", "policy", "group", "prompt", "response", "reward_team",
                  "reward_local", "advantage"):
            assert k in r
        groups.setdefault(r["group"], []).append(r)
    K = yaml.safe_load((out / "config.yaml").read_text())["rollout"]["K"]
    assert groups and all(len(g) == K for g in groups.values())
    assert all(len({r["prompt"] for r in g}) == 1 for g in groups.values())
    assert all(sorted(r["branch"] for r in g) == list(range(K)) for g in groups.values())


def test_same_seed_same_metrics(tmp_path, fast_overrides):
    a = _run(tmp_path, "a", fast_overrides)
    b = _run(tmp_path, "b", fast_overrides)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]  # noqa
    ra = strip(json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines())
    rb = strip(json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines())
    assert ra == rb
    assert (a / "rollouts" / "step_2.jsonl").read_text() == (b / "rollouts" / "step_2.jsonl").read_text()


def test_a_run_without_steps_evaluates_once_and_reports_that_evaluation_as_before_and_after(
        tmp_path, fast_overrides, monkeypatch):
    import atgrpo.trainer.run as run_module

    calls, real = [], run_module.run_eval
    monkeypatch.setattr(run_module, "run_eval", lambda *a: calls.append(1) or real(*a))
    out = str(tmp_path / "run")
    assert main(["train", *fast_overrides, "train.steps=0", "--out", out, "--quiet"]) == 0
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert len(calls) == 1 and summary["eval_after"] == summary["eval_before"]
    assert os.path.exists(os.path.join(out, "eval_transcripts.jsonl"))


def test_bad_override_is_a_clear_error(capsys):
    assert main(["train", "algo.aggregation=bogus"]) == 2
    err = capsys.readouterr().err
    assert "algo.aggregation" in err and "token-mean" in err


def test_envs_command_lists_plan_path(capsys):
    assert main(["envs"]) == 0
    assert "plan_path" in capsys.readouterr().out


def test_eval_of_a_run_directory(tmp_path, fast_overrides):
    out = _run(tmp_path, "run", fast_overrides + ["train.steps=1"])
    assert main(["eval", str(out), "eval.problems=3", "--quiet"]) == 0
    assert os.path.exists(out / "checkpoint" / "final" / "shared" / "config.json")


def test_unconfined_setting_in_the_config(monkeypatch):
    """sandbox.unconfined: true is read, allows unconfined programs and yields the start-up line."""
    from atgrpo.sandbox import allow_unconfined
    from atgrpo.trainer.run_settings import sandbox_note

    assert load_config().sandbox.unconfined is False
    assert load_config(overrides=["sandbox.unconfined=true"]).sandbox.unconfined is True
    monkeypatch.delenv("ATGRPO_SANDBOX_UNCONFINED", raising=False)
    assert sandbox_note(load_config()) is None and "ATGRPO_SANDBOX_UNCONFINED" not in os.environ
    note = sandbox_note(load_config(overrides=["sandbox.unconfined=true"]))
    assert "sandbox.unconfined: true" in note and "UNCONFINED" in note and "\n" not in note
    assert os.environ["ATGRPO_SANDBOX_UNCONFINED"] == "1"
    allow_unconfined(False)
    allow_unconfined()
    assert os.environ["ATGRPO_SANDBOX_UNCONFINED"] == "1"
    allow_unconfined(False)
    assert "ATGRPO_SANDBOX_UNCONFINED" not in os.environ
