"""Loading the config: defaults <- YAML file <- dotted ``key=value`` overrides, each value checked against its
field's type as it is read (the key named on failure), then ``checks.validate``."""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from typing import Any

import yaml

from .checks import validate
from .schema import Config, ConfigError, coerce

RENAMED_SECTIONS = {"trainer": "system"}  # old name -> new name, same keys: old files and run directories load


def _build(cls, data: dict[str, Any], path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        if key not in fields:
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {', '.join(fields)}")
        sub = _dataclass_type(cls, key)
        kwargs[key] = _build(sub, value, full) if sub is not None else coerce(hints[key], value, full)
    obj = cls(**kwargs)
    return obj


def _dataclass_type(cls, name: str):
    default = cls.__dataclass_fields__[name].default_factory  # type: ignore[attr-defined]
    if default is dataclasses.MISSING:
        return None
    probe = default()
    return type(probe) if dataclasses.is_dataclass(probe) else None


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``dotted.key=value`` override to a plain dict (value parsed as YAML: 3, 0.5, true, [1, 2])."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        if part not in node and i >= 2 and _is_free_dict(parts):  # rollout.per_agent.<role>.<key>
            node[part] = {}
        if part not in node:
            raise ConfigError(f"unknown config key {'.'.join(parts[:i + 1])!r} in override {item!r}; "
                              f"valid keys here: {', '.join(node)}")
        if not isinstance(node[part], dict):
            raise ConfigError(f"config key {'.'.join(parts[:i + 1])!r} is a value, not a section "
                              f"(override {item!r})")
        node = node[part]
    if parts[-1] not in node and not _is_free_dict(parts):
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {', '.join(node)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)})") from None
    if parts == ["env", "name"] and value != node["name"]:
        node["kwargs"] = {}  # another env: start from its own defaults (set env.kwargs.* after env.name)
    node[parts[-1]] = value


def overrides_tree(items: list[str]) -> dict[str, Any]:
    """``dotted.key=value`` overrides (values parsed as YAML) as the nested mapping a config file holds: what the
    benches write into their generated configs."""
    data: dict[str, Any] = {}
    for item in items:
        key, raw = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(raw)
    return data


def _is_free_dict(parts: list[str]) -> bool:
    return len(parts) >= 2 and parts[:2] in (["env", "kwargs"], ["rollout", "per_agent"])


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where it is."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml_file(path: str) -> Any:
    """The parsed YAML of a config file; every way it can fail is one ``ConfigError`` naming the file."""
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory; give a YAML file (e.g. configs/quickstart.yaml; "
                          f"to continue a run directory: atgrpo train --resume DIR)")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (presets live in configs/, e.g. "
                          f"configs/quickstart.yaml)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path!r} is not a text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e.strerror or e}") from None


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                training: bool = True) -> Config:
    """Defaults <- YAML file <- overrides, then validated (``training=False``: for evaluation only, which
    accepts settings that only training refuses, such as ``rollout.K=1``)."""
    cfg = read_config(path, overrides)
    validate(cfg, training=training)
    return cfg


def read_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- overrides, every key and value checked against its field's type, without the
    checks of combinations, the environment and this machine (``load_config`` adds those). ``atgrpo
    plan-memory`` reads configs meant for another machine (``model.device=cuda``, a ``model.path`` that is not
    here) this way."""
    data = Config().to_dict()
    if path:
        loaded = read_yaml_file(path)
        loaded = {} if loaded is None else loaded
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping (key: value lines), not a "
                              f"{type(loaded).__name__}")
        loaded = _renamed(loaded, path)
        _build(Config, loaded, "")  # reject unknown keys with the file's own structure
        env = loaded.get("env") or {}
        if "name" in env or "kwargs" in env:  # env kwargs belong to one env: a file's kwargs replace the defaults
            data["env"]["kwargs"] = {}
        data = _merge(data, loaded)
    for item in overrides:
        apply_override(data, _renamed_override(item))
    return _build(Config, data, "")


def load_resume_config(run_dir: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config of the run in ``run_dir``; only ``train.steps=N`` may be overridden (to extend the run)."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"cannot resume {run_dir!r}: not a run directory (no config.yaml)")
    for item in overrides:
        if item.split("=", 1)[0].strip() != "train.steps":
            raise ConfigError(f"a resumed run keeps its config ({path}); only train.steps=N may be given (to "
                              f"extend the run), not {item!r}")
    return load_config(path, overrides)


def _renamed(loaded: dict[str, Any], path: str) -> dict[str, Any]:
    """A file's renamed sections under their new names (a note on stderr; an error when both are given)."""
    for old, new in RENAMED_SECTIONS.items():
        if old in loaded:
            if new in loaded:
                raise ConfigError(f"{path}: sections {old!r} and {new!r} are one section ({old!r} is its old name); "
                                  f"keep {new!r}")
            loaded = {(new if k == old else k): v for k, v in loaded.items()}
            print(f"atgrpo: note: {path}: config section {old!r} is now called {new!r} (same keys); read as {new!r}",
                  file=sys.stderr)
    return loaded


def _renamed_override(item: str) -> str:
    """An override of a renamed section (``trainer.backend=ray``) under the section's new name."""
    head = item.split("=", 1)[0].strip().split(".")[0]
    if head in RENAMED_SECTIONS:
        new = RENAMED_SECTIONS[head]
        print(f"atgrpo: note: config section {head!r} is now called {new!r}; read {item!r} as "
              f"{new}{item.strip()[len(head):]!r}", file=sys.stderr)
        return new + item.strip()[len(head):]
    return item
