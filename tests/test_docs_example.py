"""The worked example of docs/environments.md runs and passes check_env (the docs stay true)."""

import re
from pathlib import Path

from atgrpo.envs import registry


def test_environments_doc_example_runs(monkeypatch):
    src = (Path(__file__).parent.parent / "docs" / "environments.md").read_text()
    code = re.search(r"```python\n(.*?)```", src, re.S).group(1)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # keep the global registry clean
    monkeypatch.setattr(registry, "_DESCRIPTIONS", dict(registry._DESCRIPTIONS))
    namespace: dict = {}
    exec(compile(code, "docs/environments.md", "exec"), namespace)
    env = namespace["GuessEnv"]()
    env.reset(0)
    assert env.step("h").reward.team == 0.0
    assert "guess" in registry.registered()
