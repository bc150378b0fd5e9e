"""The config tree (atgrpo/config/): defaults, YAML, dotted overrides, and loud errors naming key and choices."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from atgrpo.config import Config, ConfigError, load_config


def _yaml(tmp_path, text: str) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return str(p)


def _err(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    return str(e.value)


# ---- defaults --------------------------------------------------------------------------------------------
def test_defaults_load():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.to_dict() == Config().to_dict()
    assert cfg.env.name == "plan_path" and cfg.policy.sharing == "L1" and cfg.rollout.mode == "tree"
    assert cfg.algo.group_key == "problem_turn_agent" and cfg.algo.aggregation == "token-mean"
    assert cfg.algo.clip_low == cfg.algo.clip_high == 0.2 and cfg.algo.kl_coef == 0.0
    assert cfg.env.kwargs == {"size": 5, "wall_prob": 0.2, "max_turns": 3}
    # the default dict is not shared between instances
    a, b = load_config(), load_config()
    a.env.kwargs["size"] = 99
    assert b.env.kwargs["size"] == 5 and Config().env.kwargs["size"] == 5


def test_empty_yaml_gives_defaults(tmp_path):
    assert load_config(_yaml(tmp_path, "")).to_dict() == Config().to_dict()


def test_missing_file(tmp_path):
    msg = _err(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in msg


# ---- unknown keys ----------------------------------------------------------------------------------------
def test_unknown_top_level_key_yaml(tmp_path):
    msg = _err(_yaml(tmp_path, "seed: 1\nbogus: 3\n"))
    assert "bogus" in msg
    for valid in ("seed", "env", "algo", "rollout"):
        assert valid in msg


def test_unknown_nested_key_yaml(tmp_path):
    msg = _err(_yaml(tmp_path, "algo:\n  clip_low: 0.1\n  cliplow: 0.3\n"))
    assert "algo.cliplow" in msg and "clip_low" in msg and "aggregation" in msg
    msg = _err(_yaml(tmp_path, "model:\n  tiny:\n    hiden_size: 16\n"))
    assert "model.tiny.hiden_size" in msg and "hidden_size" in msg


def test_nested_section_not_a_mapping(tmp_path):
    msg = _err(_yaml(tmp_path, "algo: 3\n"))
    assert "algo" in msg
    msg = _err(_yaml(tmp_path, "- a\n- b\n"))
    assert "mapping" in msg


def test_unknown_key_override():
    msg = _err(overrides=["bogus=1"])
    assert "bogus" in msg and "seed" in msg and "algo" in msg
    msg = _err(overrides=["algo.cliplow=0.3"])
    assert "algo.cliplow" in msg and "clip_low" in msg
    msg = _err(overrides=["model.tiny.layers=2"])
    assert "model.tiny.layers" in msg and "num_layers" in msg


@pytest.mark.parametrize("item, valid", [("bogus.x=1", "algo"), ("algo.bogus.x=1", "clip_low")])
def test_unknown_intermediate_key_override_names_valid_keys(item, valid):
    msg = _err(overrides=[item])
    assert "bogus" in msg and valid in msg


def test_bad_override_syntax():
    assert "dotted.key=value" in _err(overrides=["algo.clip_low"])


# ---- bad choices -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("item, key, choices", [
    ("policy.sharing=L9", "policy.sharing", ["L0", "L1", "L2", "L3"]),
    ("algo.aggregation=foo", "algo.aggregation", ["token-mean", "seq-mean"]),
    ("env.name=nope", "env.name", ["plan_path", "sokoban", "sudoku"]),
    ("algo.group_key=problem_index", "algo.group_key", ["problem_turn_agent", "problem"]),
    ("algo.kl_estimator=k9", "algo.kl_estimator", ["k1", "k2", "k3"]),
    ("rollout.mode=beam", "rollout.mode", ["tree", "trajectory"]),
    ("model.kind=gguf", "model.kind", ["tiny", "hf"]),
    ("env.style=verbose", "env.style", ["compact", "chat"]),
])
def test_bad_choice_names_valid_choices(item, key, choices):
    msg = _err(overrides=[item])
    assert key in msg and item.split("=")[1] in msg
    for c in choices:
        assert c in msg


def test_bad_choice_in_yaml(tmp_path):
    msg = _err(_yaml(tmp_path, "policy:\n  sharing: L9\n"))
    assert "policy.sharing" in msg and "L3" in msg


@pytest.mark.parametrize("item, key", [
    ("rollout.K=0", "rollout.K"), ("rollout.K=2.5", "rollout.K"), ("rollout.K=true", "rollout.K"),
    ("algo.lr=0", "algo.lr"), ("algo.clip_low=-0.1", "algo.clip_low"), ("rollout.temperature=0", "temperature"),
    ("algo.minibatches=many", "algo.minibatches"), ("train.threads=-1", "train.threads"),
    ("train.checkpoint_every=1.5", "train.checkpoint_every"),
])
def test_bad_numbers(item, key):
    assert key in _err(overrides=[item])


def test_hf_needs_path():
    assert "model.path" in _err(overrides=["model.kind=hf"])


# ---- override types --------------------------------------------------------------------------------------
def test_overrides_parse_types():
    cfg = load_config(overrides=["seed=7", "rollout.K=4", "algo.clip_high=0.28", "algo.std_normalize=false",
                                 "train.dump_rollouts=[1, 5]", "rollout.temperature=1.5", "algo.alpha=0",
                                 "model.path=some/dir", "train.tensorboard=False"])
    assert cfg.seed == 7 and type(cfg.seed) is int
    assert cfg.rollout.K == 4 and type(cfg.rollout.K) is int
    assert cfg.algo.clip_high == 0.28 and type(cfg.algo.clip_high) is float
    assert cfg.algo.std_normalize is False and cfg.train.tensorboard is False
    assert cfg.train.dump_rollouts == [1, 5]
    assert cfg.rollout.temperature == 1.5
    assert cfg.algo.alpha == 0
    assert cfg.model.path == "some/dir"


def test_overrides_win_over_yaml_and_yaml_over_defaults(tmp_path):
    path = _yaml(tmp_path, "rollout:\n  K: 6\n  temperature: 1.5\nalgo:\n  aggregation: seq-mean\n")
    cfg = load_config(path, ["rollout.K=3"])
    assert cfg.rollout.K == 3 and cfg.rollout.temperature == 1.5 and cfg.algo.aggregation == "seq-mean"
    assert cfg.rollout.problems_per_step == Config().rollout.problems_per_step  # untouched siblings keep defaults


@pytest.mark.parametrize("how", ["override", "yaml"])
def test_scientific_notation_floats(tmp_path, how):
    # YAML 1.1 reads '1e-6' (no dot) as a string; float fields must still take the paper's lr = 1e-6
    cfg = load_config(overrides=["algo.lr=1e-6"]) if how == "override" else \
        load_config(_yaml(tmp_path, "algo:\n  lr: 1e-6\n"))
    assert cfg.algo.lr == pytest.approx(1e-6) and type(cfg.algo.lr) is float


@pytest.mark.parametrize("item", ["algo.clip_low=abc", "rollout.temperature=hot", "algo.lr=[1]"])
def test_non_number_for_float_field_rejected(item):
    assert item.split("=")[0] in _err(overrides=[item])


def test_scientific_notation_with_dot_works():
    assert load_config(overrides=["algo.lr=1.0e-6"]).algo.lr == pytest.approx(1e-6)


@pytest.mark.parametrize("item", ["algo.std_normalize=flase", "algo.filter_zero_variance=2",
                                  "warmstart.enabled=maybe"])
def test_non_bool_for_bool_field_rejected(item):
    msg = _err(overrides=[item])
    assert item.split("=")[0] in msg


# ---- env.kwargs is free-form -----------------------------------------------------------------------------
def test_env_kwargs_accepts_new_keys():
    cfg = load_config(overrides=["env.kwargs.roles=[plan]", "env.kwargs.size=7", "env.kwargs.max_moves=12"])
    assert cfg.env.kwargs == {"size": 7, "wall_prob": 0.2, "max_turns": 3, "roles": ["plan"], "max_moves": 12}


def test_env_kwargs_in_yaml_replace_the_defaults(tmp_path):
    """A file's env kwargs belong to its env: they replace the quickstart's Plan-Path kwargs."""
    cfg = load_config(_yaml(tmp_path, "env:\n  name: sokoban\n  kwargs:\n    num_boxes: 2\n    size: 6\n"))
    assert cfg.env.name == "sokoban"
    assert cfg.env.kwargs == {"num_boxes": 2, "size": 6}
    assert load_config(_yaml(tmp_path, "env:\n  name: sudoku\n")).env.kwargs == {}
    assert load_config(None, ["env.name=sudoku", "env.kwargs.size=9"]).env.kwargs == {"size": 9}


def test_every_field_overridable():
    """Every leaf of the default config can be set by an override of its own value (round trip)."""
    defaults = Config().to_dict()
    items = []

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict) and k != "kwargs":
                walk(v, f"{prefix}{k}.")
            elif v is not None and not isinstance(v, (dict, list)):
                items.append(f"{prefix}{k}={v}")
    walk(defaults, "")
    assert len(items) > 30
    cfg = load_config(overrides=items)
    assert cfg.to_dict() == defaults
    assert all(dataclasses.is_dataclass(getattr(cfg, f.name)) or f.name == "seed"
               for f in dataclasses.fields(cfg))


def test_quickstart_yaml_equals_the_builtin_defaults():
    from pathlib import Path

    path = Path(__file__).parent.parent / "configs" / "quickstart.yaml"
    assert load_config(str(path)).to_dict() == Config().to_dict()


# ---- Ray placement -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, n_policies, cpus, expect", [
    ({}, 1, 2, (0.5, 0.5)),  # the quickstart: 1 rollout + 1 update worker, 2 environment workers
    ({"num_update_workers": 2}, 1, 2, (0.4, 0.4)),  # docs/ray.md's first command
    ({"num_update_workers": 2}, 2, 2, (0.25, 0.25)),  # L3: 2 x 3 + 2 = 8 workers
    ({}, 1, 16, (1.0, 1.0)),  # at most 1 CPU each
    ({"num_env_workers": 1}, 1, 2, (0.6666, 0.6666)),  # Ray's steps of 0.0001, rounded down
    ({"cpus_per_worker": 0.75}, 1, 2, (0.75, 0.25)),  # the env workers share what is left
    ({"cpus_per_worker": 0.25, "cpus_per_env_worker": 0.25}, 2, 2, (0.25, 0.25)),
])
def test_ray_cpu_shares_fit_the_local_cluster(settings, n_policies, cpus, expect):
    from atgrpo.config import RayConfig, ray_cpu_shares

    r = RayConfig(**settings)
    w, e = ray_cpu_shares(r, n_policies, cpus)
    assert (w, e) == expect
    assert n_policies * (r.num_rollout_workers + r.num_update_workers) * w + r.num_env_workers * e <= cpus


@pytest.mark.parametrize("settings, says", [
    ({"cpus_per_worker": 1.0, "cpus_per_env_worker": 1.0}, "need 4 CPUs"),
    ({"cpus_per_worker": 1.0}, "leaving nothing for the other 2 workers"),
    ({"cpus_per_worker": 0.0}, "system.ray.cpus_per_worker"),
    ({"cpus_per_env_worker": -1.0}, "system.ray.cpus_per_env_worker"),
])
def test_ray_reservations_that_do_not_fit_are_config_errors(settings, says):
    pytest.importorskip("ray")
    items = ["system.backend=ray", "system.ray.num_cpus=2"] + [f"system.ray.{k}={v}" for k, v in settings.items()]
    assert says in _err(overrides=items)


# ---- the generic field check: every choice and every range comes from the declaration ------------------------
def _declared(kind: str):
    """(dotted key, field) of every field in the tree with a Literal type (kind="choice") or a range ("range")."""
    out = []

    def walk(obj, path):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            key, value = f"{path}.{f.name}" if path else f.name, getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, key)
            elif kind == "choice" and typing.get_origin(hints[f.name]) is typing.Literal:
                out.append((key, typing.get_args(hints[f.name])))
            elif kind == "range" and "lo" in f.metadata:
                out.append((key, f.metadata))
    walk(Config(), "")
    return out


@pytest.mark.parametrize("key, choices", _declared("choice"), ids=lambda x: x if isinstance(x, str) else "")
def test_every_declared_choice_is_checked(key, choices):
    msg = _err(overrides=[f"{key}=nonsense"])
    assert f"{key}='nonsense'" in msg and all(str(c) in msg for c in choices)


@pytest.mark.parametrize("key, meta", _declared("range"), ids=lambda x: x if isinstance(x, str) else "")
def test_every_declared_range_is_checked(key, meta):
    below = meta["lo"] if meta.get("lo_open") else meta["lo"] - 1
    msg = _err(overrides=[f"{key}={below}"])
    assert key in msg and "must be" in msg
    if "hi" in meta:  # and just above the top
        above = meta["hi"] if meta.get("hi_open") else meta["hi"] + 1
        assert key in _err(overrides=[f"{key}={above}"])


def test_choices_in_lists_are_checked():
    assert "logging.backends[1]='tb'" in _err(overrides=["logging.backends=[tensorboard, tb]"])


def test_the_old_section_name_trainer_reads_as_system(tmp_path, capsys):
    cfg = load_config(None, ["trainer.ray.num_env_workers=3"])
    assert cfg.system.ray.num_env_workers == 3 and "now called 'system'" in capsys.readouterr().err
    cfg = load_config(_yaml(tmp_path, "trainer:\n  ray:\n    env_retries: 5\n"))
    assert cfg.system.ray.env_retries == 5
    assert "one section" in _err(_yaml(tmp_path, "trainer: {}\nsystem: {}\n"))
