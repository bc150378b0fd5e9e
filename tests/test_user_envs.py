"""Environments from outside atgrpo: ``env.name=module:Class`` and the ``atgrpo.envs`` entry-point group, with
check_env on first use. The worked example of docs/environments.md is trained from the CLI as a subprocess."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atgrpo.envs import registry

from conftest import FAST

ROOT = Path(__file__).parent.parent
DOC_CODE = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "environments.md").read_text(), re.S).group(1)


def _cli(args, pythonpath, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "atgrpo.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_DESCRIPTIONS", dict(registry._DESCRIPTIONS))
    monkeypatch.setattr(registry, "_CHECKED", set())


def test_docs_worked_example_trains_two_steps_from_the_cli(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "guess_env.py").write_text(DOC_CODE)
    out = tmp_path / "run"
    r = _cli(["train", "env.name=guess_env:GuessEnv", "warmstart.enabled=false", *FAST, "train.threads=1",
              "--out", str(out), "--quiet"], pkg, tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r][:2] == [1, 2]
    assert "rollout/reward/hinter" in rows[0] and "rollout/reward/guesser" in rows[0]
    sample = json.loads((out / "rollouts" / "step_1.jsonl").read_text().splitlines()[0])
    assert sample["problem"].startswith("guess/train/") and sample["agent"] in ("hinter", "guesser")
    assert "guess_env:GuessEnv" in (out / "config.yaml").read_text()


def _broken_module(path: Path) -> None:
    """The docs' env with a non-deterministic reset: check_env must refuse it."""
    code = DOC_CODE.replace("register(\"guess\"", "# register(\"guess\"").replace("check_env(GuessEnv())", "")
    code = code.replace('self.problem_id = f"guess/{self.split}/{seed}"',
                        'self.problem_id = f"guess/{self.split}/{seed}"\n        self.hint = str(random.random())')
    code = code.replace('self.last_guess, self.hint = None, ""', "self.last_guess = None")
    path.write_text(code)


def test_user_env_that_breaks_check_env_is_one_line_exit_2(tmp_path):
    _broken_module(tmp_path / "broken_env.py")
    r = _cli(["train", "env.name=broken_env:GuessEnv", "warmstart.enabled=false", "--out", str(tmp_path / "run")],
             tmp_path, tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "fails check_env" in lines[0] and "not deterministic" in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, message", [
    ("no_such_module_xyz:Env", "cannot import 'no_such_module_xyz'"),
    ("json:NoSuchClass", "has no attribute 'NoSuchClass'"),
    ("json:__version__", "is not a class or a factory"),
    ("nope", "give module:Class of your own"),
])
def test_bad_user_env_names_are_config_errors(name, message, clean_registry):
    from atgrpo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [f"env.name={name}"])


def test_a_factory_that_builds_something_else_is_refused(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "not_an_env.py").write_text("def make_it(**kwargs):\n    return object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.EnvError, match="not an atgrpo.envs.MultiAgentEnv"):
        registry.make("not_an_env:make_it")


def test_entry_point_group_lists_and_builds_the_env_once_checked(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "guess_env.py").write_text(DOC_CODE.replace("check_env(GuessEnv())", ""))
    dist = tmp_path / "guess_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: guess-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[atgrpo.envs]\nguess_ep = guess_env:GuessEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.registered()["guess_ep"] == "(entry point guess_env:GuessEnv)"
    assert "guess_env" not in sys.modules  # listed without importing it
    calls = []
    monkeypatch.setattr(registry, "check_env", lambda env, **kw: calls.append(env.name))
    env = registry.make("guess_ep", max_turns=2)
    registry.make("guess_ep")
    assert env.name == "guess" and env.max_turns == 2 and calls == ["guess"]  # checked on first use only
    monkeypatch.delitem(sys.modules, "guess_env")


def test_the_entry_point_env_is_listed_by_atgrpo_envs(tmp_path):
    (tmp_path / "guess_env.py").write_text(DOC_CODE)
    dist = tmp_path / "guess_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: guess-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[atgrpo.envs]\nguess_ep = guess_env:GuessEnv\n")
    r = _cli(["envs"], tmp_path, tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^guess_ep\s+\(entry point guess_env:GuessEnv\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^plan_path\s", r.stdout, re.M)
