"""``atgrpo check``: whether a run can start, found in seconds and without training.

Each check gives findings, one line each: ``ok`` (holds), ``note`` (holds, with something to know: a download or
a conversion at start-up, a plan made at maximum lengths) or ``FAIL`` (the run would stop on it, minutes or hours
in). ``check`` runs them all and returns every finding, so a user fixes everything in one round; the command
exits 0 when nothing failed and 2 otherwise. What is checked:

- the config (every key, the environment's kwargs: what ``atgrpo train`` validates);
- the model: a preset's GGUF installed and converted, a local directory, or a hub id in the Hugging Face cache
  (offline) or downloadable; its tokenizer loads and, for chat prompts, has a chat template;
- the environment builds and resets once, and one problem's prompt of every role fits ``model.max_prompt_tokens``
  when rendered and tokenised as the rollout does;
- the sandbox's isolation on this machine, and whether the environment runs the agents' programs;
- the rollout engine (vLLM importable by the engine's Python) and Ray (installed; a cluster address reachable);
- the device (CUDA present, its count and memory) and the memory plan's verdict for it;
- the run directory writable, and free disk for the checkpoints the run keeps.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import Callable

from .config import Config, ConfigError, load_config

GIB = 1024 ** 3


@dataclass(frozen=True)
class Finding:
    level: str  # "ok" | "note" | "FAIL"
    area: str
    text: str

    def line(self) -> str:
        return f"{self.level:<5} {self.area}: {self.text}"


def check(config: str | None, overrides: list[str], out: str | None = None) -> list[Finding]:
    """Every finding for a run of ``config`` + ``overrides`` into ``out`` (default: under ``runs/``)."""
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        return [Finding("FAIL", "config", str(e))]
    found = [Finding("ok", "config", f"{config or 'the built-in default'}: env {cfg.env.name} ({cfg.env.style}), "
                                     f"{cfg.policy.sharing}, model {cfg.model.kind}")]
    model_dir: list[str | None] = [None]
    found += _guarded(lambda: _model(cfg, model_dir))
    plan = _guarded_value(lambda: _plan(cfg, model_dir[0]))
    env, built = _env(cfg)
    found += built
    for fn in (lambda: _prompts(cfg, env, model_dir[0]), lambda: _sandbox(cfg, env), lambda: _engine(cfg),
               lambda: _ray(cfg), lambda: _device(cfg, plan), lambda: _output(cfg, out, plan)):
        found += _guarded(fn)
    return found


def _guarded_value(fn):
    """``fn()``, or None where it raised (the checks that use the value then skip what needs it)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a plan that cannot be made is not a finding of its own
        return None


def _guarded(fn: Callable[[], list[Finding]]) -> list[Finding]:
    """A check that raised is a failure of that check, not of the command."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported as a finding
        return [Finding("FAIL", "check", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")]


def _model(cfg: Config, model_dir: list) -> list[Finding]:
    m = cfg.model
    if m.kind == "tiny":
        return [Finding("ok", "model", f"the tiny model ({m.tiny.num_layers} layers of {m.tiny.hidden_size})")]
    from .policies import hf, hub

    if m.preset:
        gguf = os.path.expanduser(m.gguf_file) if m.gguf_file else hf.preset_gguf(m.preset)
        cached = os.path.join(hf.cache_root(), m.preset)
        if os.path.isfile(os.path.join(cached, hf.SOURCE_FILE)):
            model_dir[0] = cached
            return [Finding("ok", "model", f"preset {m.preset}: converted in {cached}")]
        return [Finding("note", "model", f"preset {m.preset}: {gguf} is converted at start-up (once, about a "
                                         f"minute); the prompt lengths are checked after that")]
    if hub.looks_like_hub_id(m.path):
        try:
            path, commit = hub.resolve(m.path, m.revision, local_only=True)
        except hub.ModelNotFound as e:
            if hub.offline():
                return [Finding("FAIL", "model", str(e))]
            return [Finding("note", "model", f"{m.path} (revision {m.revision or 'main'}) is not in the Hugging Face "
                                             f"cache {hub.cache_dir()}: downloaded at start-up")]
        model_dir[0] = path
        return [Finding("ok", "model", f"{m.path} at commit {commit} in the Hugging Face cache ({path})")]
    model_dir[0] = os.path.expanduser(m.path)
    return [Finding("ok", "model", f"local directory {model_dir[0]}")]


def _renderer(cfg: Config, model_dir: str | None):
    """A policy that renders and encodes prompts as the run's will (its tokenizer, no weights), or None."""
    from .policies.causal_lm import CausalLMPolicy
    from .policies.tokenizer import ByteTokenizer

    if cfg.model.kind == "tiny":
        return CausalLMPolicy.renderer("check", ByteTokenizer(), cfg.model.max_prompt_tokens)
    if model_dir is None:
        return None
    from transformers import AutoTokenizer

    from .policies.hf import HFPolicy

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return HFPolicy.renderer("check", tok, cfg.model.max_prompt_tokens,
                             chat_template_kwargs={"enable_thinking": bool(cfg.model.enable_thinking)})


def _env(cfg: Config) -> tuple[object | None, list[Finding]]:
    """One training problem's environment, built and reset as the run builds it, and the finding."""
    from .trainer.setup import env_factory

    try:
        env = env_factory(cfg)("train", 0)
    except Exception as e:  # noqa: BLE001 - reported as a finding
        return None, [Finding("FAIL", "env", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")]
    return env, [Finding("ok", "env", f"{cfg.env.name} builds and resets; agents {', '.join(env.agents)}")]


def _prompts(cfg: Config, env, model_dir: str | None) -> list[Finding]:
    """Every role's turn-0 prompt of ``env`` rendered and tokenised as the run's policy does."""
    found: list[Finding] = []
    policy = _renderer(cfg, model_dir) if env is not None else None
    if policy is None:  # no environment (its own finding), or a model not here yet
        return found
    if cfg.env.style == "chat" and not getattr(policy.tokenizer, "chat_template", None):
        found.append(Finding("note", "tokenizer", "no chat template: chat prompts are rendered as plain text"))
    for agent in env.agents:
        text = policy.render(env.observe(agent))
        try:
            n = len(policy.encode(text))
        except ValueError as e:
            found.append(Finding("FAIL", "prompts", f"{agent}: {e}"))
            continue
        found.append(Finding("ok", "prompts", f"{agent}: {n} tokens at turn 0 (model.max_prompt_tokens="
                                              f"{cfg.model.max_prompt_tokens}; later turns grow)"))
    return found


def _runs_programs(env) -> bool:
    """Whether the environment runs the agents' answers as programs (in the sandbox)."""
    return getattr(env, "tool_mode", None) == "code" or type(env).__module__.rsplit(".", 1)[-1] in (
        "code", "math_env")


def _sandbox(cfg: Config, env) -> list[Finding]:
    from .sandbox import isolation

    iso, runs = isolation(), env is not None and _runs_programs(env)
    what = "runs the agents' programs" if runs else "runs no programs"
    if iso.namespaces:
        return [Finding("ok", "sandbox", f"isolates ({iso.mode}, network {'private' if iso.network else 'shared'})"
                                         f"; {cfg.env.name} {what}")]
    if not runs:
        return [Finding("ok", "sandbox", f"cannot isolate here ({iso.reason}); {cfg.env.name} {what}")]
    if cfg.sandbox.unconfined:
        return [Finding("note", "sandbox", f"cannot isolate here ({iso.reason}); sandbox.unconfined: true runs the "
                                           f"programs of {cfg.env.name} UNCONFINED")]
    return [Finding("FAIL", "sandbox", f"cannot isolate here ({iso.reason}) and {cfg.env.name} {what}: set "
                                       f"sandbox.unconfined: true to run them unconfined, or use a machine with "
                                       f"namespaces")]


def _engine(cfg: Config) -> list[Finding]:
    if cfg.rollout.engine != "vllm":
        return [Finding("ok", "engine", "native")]
    import subprocess

    from .engine.vllm_engine import engine_python, vllm_missing

    python = engine_python(cfg.rollout.vllm)
    why = vllm_missing(python)
    if why:
        return [Finding("FAIL", "engine", why)]
    r = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('vllm'))"],
                       capture_output=True, text=True, timeout=60)
    return [Finding("ok", "engine", f"vllm {r.stdout.strip() or '(version unknown)'} in {python}")]


def _ray(cfg: Config) -> list[Finding]:
    if cfg.system.backend != "ray":
        return []
    if importlib.util.find_spec("ray") is None:
        return [Finding("FAIL", "ray", "system.backend=ray but ray is not installed: pip install -e '.[ray]'")]
    from importlib.metadata import version

    found = [Finding("ok", "ray", f"ray {version('ray')} installed")]
    address = cfg.system.ray.address
    if address and address != "auto":
        host, _, port = address.split("://")[-1].partition(":")
        try:
            socket.create_connection((host, int(port or 10001)), timeout=5).close()
            found.append(Finding("ok", "ray", f"{address} reachable"))
        except (OSError, ValueError) as e:
            found.append(Finding("FAIL", "ray", f"system.ray.address={address!r} not reachable: {e}"))
    return found


def _device(cfg: Config, plan) -> list[Finding]:
    """``plan``: ``_plan``'s (shape, settings), or None."""
    from . import plan_memory as pm

    device = str(cfg.model.device)
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return [Finding("FAIL", "device", f"model.device={device}: no CUDA device here")]
        props = torch.cuda.get_device_properties(0)
        found = [Finding("ok", "device", f"{torch.cuda.device_count()} CUDA device(s), {props.name}, "
                                         f"{props.total_memory / GIB:.1f} GiB")]
        if plan is not None:
            s, r = plan
            fit = pm.fit_gpus(pm.plan(s, r), r, props.total_memory)
            level = "ok" if fit.local_fits or cfg.system.backend == "ray" else "FAIL"
            found.append(Finding(level, "memory", f"planned {fit.local_bytes / GIB:.1f} GiB on one GPU of "
                                                  f"{props.total_memory / GIB:.1f} GiB at the maximum lengths "
                                                  f"(atgrpo plan-memory for the terms)"))
        return found
    found = [Finding("ok", "device", f"cpu, {os.cpu_count()} cores")]
    available = _mem_available()
    if plan is not None and available:
        s, r = plan
        peak = sum(p.peak for p in pm.plan(s, r))
        level = "ok" if peak <= available else "note"
        found.append(Finding(level, "memory", f"planned peak {peak / GIB:.1f} GiB at the maximum lengths, "
                                              f"{available / GIB:.1f} GiB available (atgrpo plan-memory for the "
                                              f"terms)"))
    return found


def _plan(cfg: Config, model_dir: str | None):
    from . import plan_memory as pm
    from .config.checks import validate_env

    if cfg.model.kind == "hf" and model_dir is None:
        return None
    shape = pm.plan_shape(cfg, None, os.path.join(model_dir, "config.json") if model_dir else None)
    return shape, pm.settings_from_config(cfg, validate_env(cfg))


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def _output(cfg: Config, out: str | None, plan) -> list[Finding]:
    """``plan``: ``_plan``'s (shape, settings), or None (then the disk needed is not known)."""
    from . import plan_memory as pm

    target = os.path.abspath(out or "runs")
    probe = target
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:  # a file really written there (permission bits alone say yes on read-only or special file systems)
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return [Finding("FAIL", "output", f"{target}: cannot write in {probe} ({e.strerror or e})")]
    free = shutil.disk_usage(probe).free
    if plan is None:
        return [Finding("ok", "output", f"{target} writable, {free / GIB:.1f} GiB free")]
    s, r = plan
    models = pm.plan(s, r)
    # a checkpoint: every policy's weights and AdamW moments; the newest keep_checkpoints of them, and the final
    each = sum(p.weights + p.optimizer for p in models)
    need = each * (cfg.train.keep_checkpoints + 1) if cfg.train.checkpoint_every else each
    level = "ok" if need <= free else "FAIL"
    return [Finding("ok", "output", f"{target} writable"),
            Finding(level, "disk", f"checkpoints need about {need / GIB:.2f} GiB ({cfg.train.keep_checkpoints} kept "
                                   f"+ final), {free / GIB:.1f} GiB free")]


# what ``atgrpo train`` stops on before any work: definite problems the run would otherwise meet later (the
# config, the model and the run directory it checks itself; a plan at maximum lengths is not definite)
TRAIN_AREAS = ("prompts", "sandbox", "engine", "ray", "disk")


def train_blockers(cfg: Config, out: str) -> list[Finding]:
    """The failed findings among ``TRAIN_AREAS`` for a run of ``cfg`` into ``out`` (checks that could not run
    are left to the run)."""
    holder: list[str | None] = [None]
    _guarded(lambda: _model(cfg, holder))  # where the model's files are, if they are here already
    model_dir = holder[0]
    plan = _guarded_value(lambda: _plan(cfg, model_dir))
    env, found = _env(cfg)  # a failure to build it is the run's to report, as it reports it now
    for fn in (lambda: _prompts(cfg, env, model_dir), lambda: _sandbox(cfg, env), lambda: _engine(cfg),
               lambda: _ray(cfg), lambda: _output(cfg, out, plan)):
        found += _guarded(fn)
    return [f for f in found if f.level == "FAIL" and f.area in TRAIN_AREAS]
