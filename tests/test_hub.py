"""Hub ids in ``model.path`` (``policies/hub.py``): resolved through a Hugging Face cache laid out here (offline),
the download path through huggingface_hub's download function replaced by one that writes the files, the
commit pinned into the run's config, and one line when a model is missing."""

from __future__ import annotations

import os

import huggingface_hub
import pytest
import yaml

from atgrpo.cli import main
from atgrpo.config import ConfigError, load_config
from atgrpo.policies import hub
from atgrpo.trainer.run_settings import pin_model
from hf_dirs import hf_overrides, needs_smollm2, write_tiny_hf_dir

REPO, COMMIT = "atgrpo-test/tiny-chat", "0123456789abcdef0123456789abcdef01234567"


def _lay_out(home, commit: str = COMMIT) -> str:
    """``$HF_HOME/hub/models--org--name/snapshots/<commit>/`` with a tiny model, and ``refs/main`` naming it."""
    repo = os.path.join(str(home), "hub", "models--" + REPO.replace("/", "--"))
    snap = write_tiny_hf_dir(os.path.join(repo, "snapshots", commit))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snap


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def test_a_hub_id_trains_from_the_cache_offline_and_pins_its_commit(hf_home, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = _lay_out(hf_home)
    assert hub.looks_like_hub_id(REPO) and hub.resolve(REPO) == (snap, COMMIT)
    out = tmp_path / "run"
    assert main(["train", *hf_overrides(REPO, "train.steps=1"), "--out", str(out), "--quiet"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())["model"]
    assert saved["path"] == REPO and saved["revision"] == COMMIT  # a resume reads the same snapshot


def test_a_missing_model_offline_is_one_line(hf_home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["train", *hf_overrides(REPO, "model.revision=v1"), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert REPO in err and "revision v1" in err and os.path.join(str(hf_home), "hub") in err and "HF_HUB_OFFLINE" in err


def test_the_download_path_writes_the_cache_once_and_pins_the_commit(hf_home, monkeypatch):
    """Online: huggingface_hub's snapshot download is asked for the run's files only, into the cache named by the
    environment; here it is replaced by a function that writes them where the real one would."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def fake_snapshot_download(repo_id, *, revision=None, cache_dir=None, local_files_only=False,
                               allow_patterns=None, **kwargs):
        calls.append((repo_id, revision, cache_dir, local_files_only))
        assert "*.safetensors" in allow_patterns and "*.json" in allow_patterns
        return _lay_out(os.path.dirname(cache_dir), commit="f" * 40)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    cfg = load_config(None, hf_overrides(REPO))
    lines = []
    pinned = pin_model(cfg, lines.append)
    assert pinned.model.revision == "f" * 40 and cfg.model.revision is None  # the caller's config unchanged
    assert calls == [(REPO, None, os.path.join(str(hf_home), "hub"), False)]
    assert "f" * 40 in lines[0] and REPO in lines[0]
    assert pin_model(pinned, lines.append).model.revision == "f" * 40 and calls[-1][1] == "f" * 40


def test_revision_goes_with_a_hub_id_only(tmp_path):
    local = write_tiny_hf_dir(str(tmp_path / "m"))
    assert not hub.looks_like_hub_id(local) and not hub.looks_like_hub_id("./a/b")
    with pytest.raises(ConfigError, match="model.revision"):
        load_config(None, hf_overrides(local, "model.revision=main"))


@needs_smollm2
def test_smollm2_trains_a_step_offline_through_its_hub_id(hf_home, tmp_path, monkeypatch):
    """The shipped SmolLM2 files laid out as the Hugging Face cache holds ``HuggingFaceTB/SmolLM2-135M-Instruct``
    (its converted directory, linked file by file): one step of math through the hub id, offline."""
    from atgrpo.config import ModelConfig
    from atgrpo.policies.hf import resolve_model_dir

    converted = resolve_model_dir(ModelConfig(kind="hf", preset="smollm2-135m"))  # converted once, then cached
    repo = os.path.join(str(hf_home), "hub", "models--HuggingFaceTB--SmolLM2-135M-Instruct")
    snap = os.path.join(repo, "snapshots", COMMIT)
    os.makedirs(snap)
    for name in os.listdir(converted):
        os.symlink(os.path.join(converted, name), os.path.join(snap, name))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(COMMIT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    args = ["model.kind=hf", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct", "env.name=math", "env.style=chat",
            "train.steps=1", "rollout.K=2", "rollout.problems_per_step=2", "rollout.max_new_tokens=8",
            "eval.problems=1", "warmstart.enabled=false", "model.precision=float32", "train.tensorboard=false",
            "train.plot=false"]
    assert main(["train", *args, "--out", str(out), "--quiet"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["revision"] == COMMIT
