"""logging.backends: wandb (offline) and mlflow (a local file: store) get the same metric names and values as
metrics.jsonl and the resolved config as the run's parameters; both are written by a real run and read back."""

from __future__ import annotations

import glob
import json
import math
import os
import struct

import pytest
import yaml

from atgrpo.cli import main
from atgrpo.config import ConfigError, load_config
from atgrpo.trainer.metrics import flatten, step_line

BLOCK, HEADER = 32768, 7  # the .wandb file: a 7-byte header, then LevelDB-log records in 32 KiB blocks


def read_wandb_file(path: str) -> list:
    """The protobuf records of an offline run's ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, out, parts = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (1, 2) else parts + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _scalars(row):
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def test_wandb_offline_and_mlflow_file_store_are_written_and_read_back(tmp_path, fast_overrides, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert main(["train", *fast_overrides, "warmstart.enabled=false", "eval.problems=2",
                 "logging.backends=[wandb, mlflow]", "logging.project=bench-test", "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    params = flatten(yaml.safe_load((out / "config.yaml").read_text()))
    assert params["logging.backends"] == ["wandb", "mlflow"] and params["train.threads"] >= 1
    ids = json.loads((out / "logging_ids.json").read_text())

    # wandb: the offline run's file holds every row (same names, same values) and the config
    (path,) = glob.glob(str(out / "wandb" / "wandb" / "offline-run-*" / f"run-{ids['wandb']}.wandb"))
    records = read_wandb_file(path)
    history: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            item = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(item["_step"], {}).update(item)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "bench-test" and run.display_name == "run" and run.run_id == ids["wandb"]
    wb_config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in run.config.update}
    assert {k: wb_config[k]["value"] if isinstance(wb_config[k], dict) and "value" in wb_config[k] else wb_config[k]
            for k in params} == params
    expected: dict[int, dict] = {}
    for row in rows:
        expected.setdefault(row["step"], {}).update(_scalars(row))
    assert sorted(history) == sorted(expected) == [1, 2]
    for step, values in expected.items():
        for k, v in values.items():
            assert history[step][k] == pytest.approx(v, rel=1e-6, abs=1e-9), (step, k)

    # mlflow: the file store in the run directory has the run, its params and every metric's history
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{out}/mlruns")
    ml_run = client.get_run(ids["mlflow"])
    assert ml_run.info.status == "FINISHED" and ml_run.info.run_name == "run"
    assert client.get_experiment(ml_run.info.experiment_id).name == "bench-test"
    assert ml_run.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
    for key in {k for values in expected.values() for k in values}:
        hist = {m.step: m.value for m in client.get_metric_history(ids["mlflow"], key)}
        want = {step: values[key] for step, values in expected.items() if key in values}
        assert hist.keys() == want.keys(), key
        for step in want:
            assert hist[step] == pytest.approx(want[step], rel=1e-6, abs=1e-9), (key, step)


def test_logging_settings_are_checked():
    with pytest.raises(ConfigError, match=r"logging.backends\[1\]='neptune' is not valid; choose one of: "
                                          r"tensorboard, wandb, mlflow"):
        load_config(None, ["logging.backends=[tensorboard, neptune]"])
    with pytest.raises(ConfigError, match="logging.wandb_mode='cloud' is not valid"):
        load_config(None, ["logging.wandb_mode=cloud"])


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_and_mlflow_runs(tmp_path, fast_overrides, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    args = [*fast_overrides, "warmstart.enabled=false", "eval.problems=2", "train.steps=1",
            "logging.backends=[wandb, mlflow]"]
    assert main(["train", *args, "--out", str(out), "--quiet"]) == 0
    ids = json.loads((out / "logging_ids.json").read_text())
    assert main(["train", "--resume", str(out), "train.steps=2", "--quiet"]) == 0
    assert json.loads((out / "logging_ids.json").read_text()) == ids
    assert len(glob.glob(str(out / "wandb" / "wandb" / f"offline-run-*-{ids['wandb']}"))) == 2  # one per process
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{out}/mlruns")
    assert [r.info.run_id for r in client.search_runs([client.get_run(ids["mlflow"]).info.experiment_id])] == [
        ids["mlflow"]]
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "rollout/success_rate")] == [1, 2]
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED"


def test_the_step_line_shows_the_reference_kl_only_under_a_penalty():
    m = {"step": 3, "rollout/success_rate": 0.5, "rollout/reward/tool": 1.25, "loss/approx_kl": 0.002}
    assert "ref-kl" not in step_line(m) and "reward tool=+1.25" in step_line(m)
    assert "kl 0.0020 ref-kl 0.0123 |" in step_line({**m, "loss/ref_kl": 0.0123})
