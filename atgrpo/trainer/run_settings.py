"""What a run settles about the machine at start-up, before any work: torch's threads, the compute precision, and
whether programs may run unconfined. ``train.threads=0`` and ``model.precision: auto`` are resolved here and
recorded in the returned config (config.yaml), so a resumed run makes the same choices, also on another machine."""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ..config import Config
from ..threads import choose_threads


def sandbox_note(cfg: Config) -> str | None:
    """With ``sandbox.unconfined: true``, allow unconfined programs (through the environment, so that Ray's
    environment workers see it too) and return the start-up line that says so."""
    if not cfg.sandbox.unconfined:
        return None
    from ..sandbox import allow_unconfined

    allow_unconfined()
    return ("atgrpo: sandbox.unconfined: true -- where this machine cannot isolate programs, the programs the "
            "agents write run UNCONFINED (they can read and write your files and reach the network)")


def set_threads(cfg: Config, say: Callable[..., None]) -> Config:
    """torch's CPU threads for this run; ``train.threads=0`` is resolved and recorded in the returned config
    (config.yaml), so a resumed run uses the same count and writes the same rows."""
    threads, why = choose_threads(cfg.train.threads)
    torch.set_num_threads(threads)
    if not cfg.train.threads:
        cfg = copy.deepcopy(cfg)
        cfg.train.threads = threads
    say(f"atgrpo: threads={threads} ({why}; set train.threads=N to choose)")
    return cfg


def set_precision(cfg: Config, say: Callable[..., None]) -> Config:
    """The run's compute precision (``model.precision``): ``auto`` is resolved for this machine and recorded in
    the returned config (config.yaml), so a resumed run keeps it even on another machine."""
    from ..policies.precision import resolve_precision

    precision, why = resolve_precision(cfg.model, cfg.system.backend)
    if cfg.model.precision == "auto" and cfg.model.dtype == "float32":
        cfg = copy.deepcopy(cfg)
        cfg.model.precision = precision
    if cfg.model.kind == "hf" or precision != "float32":
        other = "float32" if precision == "bfloat16" else "bfloat16"
        say(f"atgrpo: precision={precision} ({why}; model.precision={other} to change)")
    return cfg


def pin_model(cfg: Config, say: Callable[..., None]) -> Config:
    """A hub id in ``model.path`` resolved through the Hugging Face cache (downloaded unless ``HF_HUB_OFFLINE=1``)
    before any other work, and ``model.revision`` pinned to the commit found, in the returned config
    (config.yaml): a resume, and the vLLM engine, read the same files. Local directories and presets are
    unchanged."""
    from ..config import ConfigError
    from ..policies import hub

    if cfg.model.kind != "hf" or cfg.model.preset or not hub.looks_like_hub_id(cfg.model.path):
        return cfg
    try:
        path, commit = hub.resolve(cfg.model.path, cfg.model.revision)
    except hub.ModelNotFound as e:
        raise ConfigError(str(e)) from None
    if cfg.model.revision != commit:
        cfg = copy.deepcopy(cfg)
        cfg.model.revision = commit
    say(f"atgrpo: model {cfg.model.path} at commit {commit} ({path})")
    return cfg
