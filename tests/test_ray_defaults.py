"""``atgrpo train system.backend=ray`` with the default placement on a 2-CPU local cluster: the workers share the
CPUs (a printed note says how), the run finishes, and its rows equal the local backend's (same seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from atgrpo.cli import main  # noqa: E402

from conftest import FAST  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = FAST + ["warmstart.enabled=false", "eval.problems=2", "train.threads=1"]
CLOSE = ("loss", "pg", "clipfrac", "approx_kl", "grad_norm")


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_ray_defaults_fit_a_two_cpu_cluster_and_match_the_local_backend(tmp_path):
    ray_out, local_out = str(tmp_path / "ray"), str(tmp_path / "local")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "atgrpo.cli", "train", *RUN, "system.backend=ray",
                             "system.ray.num_cpus=2", "--out", ray_out], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert main(["train", *RUN, "--out", local_out, "--quiet"]) == 0  # meanwhile, the local twin
        out, err = proc.communicate(timeout=900)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    # L1 quickstart: 1 policy x (1 rollout + 1 update worker) + 2 environment workers on 2 CPUs
    assert ("atgrpo: Ray: 4 workers share the local cluster's 2 CPUs: 0.5 CPU per rollout/update worker, 0.5 per "
            "environment worker") in out, out[-3000:]
    ray_rows, local_rows = _rows(ray_out), _rows(local_out)
    assert [r["step"] for r in ray_rows] == [r["step"] for r in local_rows] == [1, 2, 2]
    for a, b in zip(local_rows, ray_rows):
        for k, v in a.items():
            if k.startswith(("time/", "perf/")):
                continue
            if k.split("/")[-1] in CLOSE or k.startswith("adv/"):
                assert abs(v - b[k]) <= 1e-6 + 1e-4 * abs(v), (k, v, b[k])
            else:
                assert v == b[k], (k, v, b[k])  # rewards, success, groups, evaluation: exact
        assert b.get("ray/dropped_samples", 0) == 0
