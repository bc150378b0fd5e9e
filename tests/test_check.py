"""``atgrpo check``: one line per finding, every problem listed at once, exit 2 when the run cannot start."""

from __future__ import annotations

import importlib.util

import pytest

from atgrpo import preflight
from atgrpo.cli import main
from atgrpo.sandbox.confine import Isolation


def _levels(found) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in found:
        out.setdefault(f.area, []).append(f.level)
    return out


def test_the_default_run_can_start(tmp_path, capsys):
    assert main(["check", "--out", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    areas = {ln.split(":")[0].split()[-1] for ln in lines if ln.startswith("ok")}
    assert {"config", "model", "env", "prompts", "sandbox", "engine", "device", "memory", "output", "disk"} <= areas
    assert lines[-1] == "the run can start" and not any(ln.startswith("FAIL") for ln in lines)
    assert not (tmp_path / "run").exists()  # nothing written


def test_every_problem_is_listed_at_once(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code = main(["check", "model.max_prompt_tokens=40", "--out", str(afile / "run")])
    out = capsys.readouterr().out
    assert code == 2 and "3 problem(s): the run cannot start" in out  # both roles' prompts, the output
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert any("prompts: tool:" in ln and "max_prompt_tokens=40" in ln for ln in fails), fails
    assert any("output:" in ln and "afile" in ln for ln in fails), fails


def test_train_stops_before_any_work_on_what_check_finds(tmp_path, monkeypatch, capsys):
    """``atgrpo train`` runs the definite checks first: programs that nothing here can isolate, prompts longer
    than the model takes; each is one line, exit 2, nothing written."""
    import atgrpo.sandbox as sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation("none", False, True, "no namespaces here"))
    out = tmp_path / "run"
    assert main(["train", "env.kwargs.tool_mode=code", "model.max_prompt_tokens=40", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert any(ln.startswith("atgrpo: error: sandbox: cannot isolate here") for ln in err), err
    assert sum(ln.startswith("atgrpo: error: prompts:") for ln in err) == 2 and not out.exists()


def test_a_bad_config_is_the_one_finding(capsys):
    assert main(["check", "rollout.K=0"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("FAIL  config: rollout.K=0") and len(out) == 2


def test_a_hub_id_missing_offline_fails_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    found = preflight.check(None, ["model.kind=hf", "model.path=atgrpo-test/nothing", "env.style=chat"],
                            str(tmp_path / "run"))
    model = [f for f in found if f.area == "model"]
    assert [f.level for f in model] == ["FAIL"] and "atgrpo-test/nothing" in model[0].text
    assert _levels(found)["env"] == ["ok"]  # the other checks still ran


def test_programs_without_isolation_fail_unless_unconfined(tmp_path, monkeypatch):
    import atgrpo.sandbox as sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation("none", False, True, "no namespaces here"))
    code_mode = ["env.kwargs.tool_mode=code"]
    assert _levels(preflight.check(None, code_mode, str(tmp_path / "r")))["sandbox"] == ["FAIL"]
    assert _levels(preflight.check(None, code_mode + ["sandbox.unconfined=true"], str(tmp_path / "r")))[
        "sandbox"] == ["note"]
    assert _levels(preflight.check(None, [], str(tmp_path / "r")))["sandbox"] == ["ok"]  # no programs to run


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_an_unreachable_ray_cluster_fails(tmp_path):
    found = preflight.check(None, ["system.backend=ray", "system.ray.address=ray://127.0.0.1:1"], str(tmp_path / "r"))
    assert _levels(found)["ray"] == ["ok", "FAIL"]


def test_vllm_missing_is_named_and_the_same_config_can_start_without_it(tmp_path, capsys):
    """``rollout.engine=vllm`` whose Python has no vLLM: exit 2 naming vLLM; the same config with the native
    engine: exit 0 (the real SmolLM2 math config)."""
    import sys

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vLLM")
    import os

    out = str(tmp_path / "run")
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "real",
                          "math_mas_L1.yaml")
    assert main(["check", config, "rollout.engine=vllm", f"rollout.vllm.python={sys.executable}", "--out", out]) == 2
    printed = capsys.readouterr().out
    assert "FAIL  engine:" in printed and "vllm" in printed.lower()
    assert "ok    env:" in printed and "ok    disk:" in printed  # every other check still ran and is listed
    assert main(["check", config, "--out", out]) == 0
