"""Checkpoints and exact resume (the run directory's lock and stop flag: ``run_dir.py``; atomic writes and
manifests: ``atomic_files.py``).

Layout under ``RUN_DIR/checkpoint/``:

    step_<N>/               everything needed to continue exactly after step N
      <policy>/             the model (``save_pretrained``: ``from_pretrained`` loads it) + atgrpo_policy.json
      trainer_state.pt      optimizer states; RNG states (python, numpy, torch CPU/CUDA, the loop's generator)
      progress.json         step, the metrics rows so far, eval history, eval_before, warm-start flag and
                            losses, the non-finite update count
    reference/<policy>/     the frozen KL reference (only with algo.kl_coef > 0), written once after warm start
    final/<policy>/         the trained policies at the end (what ``atgrpo eval RUN_DIR`` loads)

Every checkpoint directory is written into a ``.tmp-*`` directory next to it, then ``manifest.json`` (every
file's size and sha256) is written last, every file fsynced, and the directory renamed into place: one rename is
atomic on POSIX, so a crash mid-write leaves the previous checkpoints intact and a ``.tmp-*`` leftover that is
ignored and removed by the next run on the directory. Only the newest ``train.keep_checkpoints`` step
checkpoints are kept.

On resume the checkpoints are verified newest first against their manifests (and then loaded); a damaged one
(a truncated, changed or missing file) is skipped with a warning naming it and moved aside to
``damaged-step_<N>``, and the run continues from the newest intact one. When none is intact, ``ResumeError``
lists what is wrong with each.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from .atomic_files import FORMAT, TMP_PREFIX, temporary_name, verify_dir, write_dir_atomically
from .run_dir import ResumeError, one_line

if TYPE_CHECKING:
    from .state import TrainState

CHECKPOINT_DIR = "checkpoint"
DAMAGED_PREFIX = "damaged-"
STATE_FILE = "trainer_state.pt"
PROGRESS_FILE = "progress.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def remove_leftovers(run_dir: str) -> None:
    """Remove ``.tmp-*`` leftovers of a crashed write (call only while holding the run's lock)."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    for parent in (run_dir, root):
        if os.path.isdir(parent):
            for name in os.listdir(parent):
                if name.startswith(TMP_PREFIX):
                    p = os.path.join(parent, name)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


# ---- policies -----------------------------------------------------------------------------------------
def save_policies(state: "TrainState", path: str) -> None:
    """Every policy in transformers format under ``path/<policy>/`` (not atomic: see ``write_dir_atomically``)."""
    with _no_hf_progress_bars():
        for pid, policy in state.policies.items():
            _save_one(state, pid, policy, os.path.join(path, pid))


@contextlib.contextmanager
def _no_hf_progress_bars():
    """No "Writing model shards" bar at every checkpoint."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save_one(state: "TrainState", pid: str, policy, d: str) -> None:
    policy.model.save_pretrained(d)  # L2: the role's adapter in peft's format (policies/lora.py)
    if hasattr(policy.tokenizer, "save_pretrained"):  # HF tokenizers (with the chat template); not ByteTokenizer
        policy.tokenizer.save_pretrained(d)
    with open(os.path.join(d, "atgrpo_policy.json"), "w") as f:
        json.dump({"policy": pid, "tokenizer": type(policy.tokenizer).__name__,
                   "agents": [a for a, p in state.agent_to_policy.items() if p == pid]}, f, indent=1)


def load_model_weights(model: torch.nn.Module, path: str) -> None:
    """Load the weights ``save_pretrained`` wrote in ``path`` into ``model`` in place (exact bits).

    Reads the safetensors files directly (no second model in memory); weights tied to a loaded one (e.g. the
    LM head tied to the embeddings, which ``save_pretrained`` leaves out) count as loaded. Falls back to
    ``from_pretrained`` when the saved names differ from the model's own."""
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) if os.path.isdir(path) else []
    if files:
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(os.path.join(path, f), device="cpu"))
        own = model.state_dict()
        if set(sd) <= set(own):
            loaded = {own[k].data_ptr() for k in sd}
            if all(own[k].data_ptr() in loaded for k in own if k not in sd):
                model.load_state_dict(sd, strict=False)
                return
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ResumeError(f"no saved model in {path} (expected config.json and *.safetensors)")
    from transformers import AutoModelForCausalLM

    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path).state_dict())


def save_references(run_dir: str, state: "TrainState", at: Callable[[str], None] | None = None) -> None:
    """The frozen KL references, once (they never change during the run)."""
    def write(tmp: str) -> None:
        with _no_hf_progress_bars():
            for pid, ref in state.references.items():
                ref.model.save_pretrained(os.path.join(tmp, pid))
    write_dir_atomically(os.path.join(run_dir, CHECKPOINT_DIR, "reference"), write, at)


def load_references(run_dir: str, state: "TrainState") -> dict:
    path = os.path.join(run_dir, CHECKPOINT_DIR, "reference")
    problem = verify_dir(path) if os.path.isdir(path) else None
    if problem:
        raise ResumeError(f"the saved KL reference policies in {path} are damaged ({problem}); they cannot be "
                          f"rebuilt, so this run cannot continue: start it again in another --out")
    refs = {}
    for pid, policy in state.policies.items():
        if not os.path.isdir(os.path.join(path, pid)):
            raise ResumeError(f"algo.kl_coef > 0 but there is no saved reference policy at {path}/{pid}")
        refs[pid] = copy.deepcopy(policy)
        load_model_weights(refs[pid].model, os.path.join(path, pid))
    return refs


# ---- RNG ----------------------------------------------------------------------------------------------
def rng_states(generator: torch.Generator) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    st = {"python": random.getstate(), "torch": torch.get_rng_state(), "generator": generator.get_state(),
          "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_states(st: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(_as_tuple(st["python"]))
    torch.set_rng_state(st["torch"])
    generator.set_state(st["generator"])
    name, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---- step checkpoints ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str


def list_checkpoints(run_dir: str) -> list[Checkpoint]:
    """The complete step checkpoints of a run, oldest first."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, PROGRESS_FILE)) and os.path.isfile(os.path.join(path, STATE_FILE)):
            out.append(Checkpoint(int(m.group(1)), path))
    return sorted(out, key=lambda c: c.step)


def latest_checkpoint(run_dir: str) -> Checkpoint | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(run_dir: str, state: "TrainState", progress: dict[str, Any], keep: int,
                    at: Callable[[str], None] | None = None) -> str:
    """Write ``checkpoint/step_<state.step>`` atomically, then drop all but the newest ``keep``. ``at(stage)`` is
    called as each stage starts (``CHECKPOINT_STAGES``): what a failure names, and where a test can crash it."""
    at = at or (lambda stage: None)
    path = os.path.join(run_dir, CHECKPOINT_DIR, f"step_{state.step}")

    def write(tmp: str) -> None:
        at("policies")
        save_policies(state, tmp)
        at("trainer_state")
        with open(os.path.join(tmp, STATE_FILE), "wb") as f:  # a file object: a full disk's OSError is kept
            torch.save({"format": FORMAT, "step": state.step,  # (a path: torch's RuntimeError, errno lost)
                        "optimizers": {pid: opt.state_dict() for pid, opt in state.optimizers.items()},
                        "rng": rng_states(state.generator)}, f)
        at("progress")
        with open(os.path.join(tmp, PROGRESS_FILE), "w") as f:
            json.dump({"format": FORMAT, **progress, "step": state.step}, f)

    write_dir_atomically(path, write, at)
    at("prune")
    drop_old_checkpoints(run_dir, keep, at)
    at("done")
    return path


def drop_old_checkpoints(run_dir: str, keep: int, at: Callable[[str], None] | None = None) -> None:
    """Remove all but the newest ``keep`` step checkpoints (after a new one; on a resume, those a run killed
    between its checkpoint and this left)."""
    ckpts = list_checkpoints(run_dir)
    for old in ckpts[:max(0, len(ckpts) - keep)]:
        trash = temporary_name(os.path.dirname(old.path), os.path.basename(old.path) + "-drop")
        os.rename(old.path, trash)  # renamed first: a half-deleted checkpoint never looks complete
        if at is not None:
            at("dropping")
        shutil.rmtree(trash, ignore_errors=True)


# the stages of a checkpoint's write, in order (``save_checkpoint``'s ``at``; ``moved-aside`` only when a stale
# directory of the same name is replaced, ``dropping`` once per older checkpoint dropped)
CHECKPOINT_STAGES = ("policies", "trainer_state", "progress", "manifest", "fsync", "rename", "moved-aside", "prune",
                     "dropping", "done")
STAGE_FILES = {"policies": "the policies' weights and config", "trainer_state": STATE_FILE,
               "progress": PROGRESS_FILE, "manifest": "manifest.json", "fsync": "fsync",
               "rename": "its rename into place", "moved-aside": "its rename into place",
               "prune": "removing older checkpoints", "dropping": "removing older checkpoints", "done": "done"}


def step_dirs(run_dir: str) -> list[Checkpoint]:
    """Every ``step_<N>`` directory of a run, newest first, complete or not (``list_checkpoints``: complete)."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    out = [Checkpoint(int(m.group(1)), os.path.join(root, n)) for n in os.listdir(root) if (m := _STEP_DIR.match(n))]
    return sorted(out, key=lambda c: -c.step)


def restore_newest_intact(run_dir: str, state: "TrainState",
                          warn: Callable[[str], None] | None = None) -> tuple[Checkpoint, dict[str, Any]] | None:
    """Load the newest intact step checkpoint into ``state``; return it and its progress, or None when the run
    has no checkpoint. Each checkpoint is verified against its manifest, then loaded; a damaged one is skipped
    (``warn`` gets a line naming it and why) and moved aside to ``damaged-step_<N>``. Raises ``ResumeError`` when
    there are checkpoints but none is intact."""
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    damaged: list[tuple[Checkpoint, str]] = []
    for ckpt in step_dirs(run_dir):
        problem = verify_dir(ckpt.path)
        if problem is None:
            try:
                progress = load_checkpoint(ckpt, state)
            except Exception as e:  # no manifest (an older run), or contents that do not load
                problem = one_line(e)
        if problem is not None:
            damaged.append((ckpt, problem))
            continue
        for bad, why in damaged:
            aside = _aside_name(bad.path)
            os.rename(bad.path, aside)
            warn(f"atgrpo: warning: checkpoint {bad.path} is damaged ({why}); skipped it and moved it to {aside}")
        if damaged:
            warn(f"atgrpo: warning: resuming from {ckpt.path}, the newest intact checkpoint")
        return ckpt, progress
    if damaged:
        root = os.path.join(run_dir, CHECKPOINT_DIR)
        raise ResumeError(f"no intact checkpoint in {root}: " + "; ".join(
            f"{os.path.basename(c.path)}: {why}" for c, why in damaged) + ". To start this run again from the "
            f"beginning, move {root} aside and resume again, or start a new run with another --out")
    return None


def _aside_name(path: str) -> str:
    parent, base = os.path.split(path)
    out, n = os.path.join(parent, DAMAGED_PREFIX + base), 1
    while os.path.exists(out):
        n += 1
        out = os.path.join(parent, f"{DAMAGED_PREFIX}{base}-{n}")
    return out


def load_checkpoint(ckpt: Checkpoint, state: "TrainState") -> dict[str, Any]:
    """Restore policies, optimizers, RNG states and the step counter into ``state``; return the progress."""
    with open(os.path.join(ckpt.path, PROGRESS_FILE)) as f:
        progress = json.load(f)
    blob = torch.load(os.path.join(ckpt.path, STATE_FILE), map_location="cpu", weights_only=True)
    if set(blob["optimizers"]) != set(state.optimizers):
        raise ResumeError(f"checkpoint {ckpt.path} holds policies {sorted(blob['optimizers'])}, the config "
                          f"builds {sorted(state.optimizers)}")
    for pid, policy in state.policies.items():
        load_model_weights(policy.model, os.path.join(ckpt.path, pid))
        state.optimizers[pid].load_state_dict(blob["optimizers"][pid])
    set_rng_states(blob["rng"], state.generator)
    state.step = int(blob["step"])
    return progress


