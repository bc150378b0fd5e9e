"""Bad input to ``atgrpo train``, as a new user gives it: every row is a real ``atgrpo train`` process that must
stop before any work with one line on stderr naming the key or path, the documented exit status, no traceback,
and no run directory (or, when the user named an existing directory, nothing left in it).

The rows run in parallel (each process stops at validation, ~3 s); every row is then its own test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_CUDA_DEVICE = "cuda:99" if torch.cuda.is_available() else "cuda"  # a device this machine does not have
try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

# (id, arguments ({tmp}: a scratch directory holding the files below), exit status, strings the line names)
ROWS = [
    # held before this test existed
    ("unknown key", ["bogus=1"], 2, ["'bogus'", "valid keys"]),
    ("non-integer K", ["rollout.K=abc"], 2, ["rollout.K", "integer"]),
    ("zero K", ["rollout.K=0"], 2, ["rollout.K=0", ">= 1"]),
    ("negative lr", ["algo.lr=-1"], 2, ["algo.lr=-1", "> 0"]),
    ("non-numeric lr", ["algo.lr=fast"], 2, ["algo.lr", "number"]),
    ("negative temperature", ["rollout.temperature=-1"], 2, ["rollout.temperature=-1"]),
    ("missing config file", ["{tmp}/nope.yaml"], 2, ["nope.yaml", "not found"]),
    ("YAML list", ["{tmp}/list.yaml"], 2, ["list.yaml", "mapping"]),
    ("missing model path", ["model.kind=hf", "model.path=/no/such/model-dir"], 2, ["/no/such/model-dir"]),
    ("hub id not in the cache, offline", ["model.kind=hf", "model.path=Qwen/Qwen3-1.7B"], 2,
     ["Qwen/Qwen3-1.7B", "revision main", "not in the Hugging Face cache", "HF_HUB_OFFLINE"]),
    # tracebacks before
    ("fractional steps", ["train.steps=2.5"], 2, ["train.steps=2.5", "integer"]),
    ("non-integer seed", ["seed=abc"], 2, ["seed='abc'", "integer"]),
    ("malformed YAML", ["{tmp}/broken.yaml"], 2, ["broken.yaml", "not valid YAML", "line 4"]),
    ("directory as config", ["{tmp}/adir"], 2, ["adir", "is a directory"]),
    ("model.path is a file", ["model.kind=hf", "model.path={tmp}/afile"], 2, ["afile", "is a file"]),
    ("device without CUDA", [f"model.device={NO_CUDA_DEVICE}"], 2, [f"model.device='{NO_CUDA_DEVICE}'"]),
    ("heads do not divide hidden", ["model.tiny.hidden_size=32", "model.tiny.num_heads=3"], 2,
     ["model.tiny.hidden_size=32", "model.tiny.num_heads=3"]),
    ("odd head size", ["model.tiny.hidden_size=30", "model.tiny.num_heads=2"], 2, ["model.tiny", "even"]),
    ("unknown env kwarg", ["env.kwargs.bogus=1"], 2, ["env.kwargs.bogus", "size", "wall_prob"]),
    ("env kwarg of the wrong type", ["env.kwargs.size=abc"], 2, ["env.kwargs.size='abc'", "integer"]),
    ("env kwarg the env refuses", ["env.kwargs.wall_prob=0.9"], 2, ["env.kwargs", "wall_prob"]),
    ("env kwarg set by atgrpo", ["env.kwargs.split=eval"], 2, ["env.kwargs.split"]),
    ("negative weight decay", ["algo.weight_decay=-0.1"], 2, ["algo.weight_decay=-0.1", ">= 0"]),
    ("--out is a file", ["--out", "{tmp}/afile"], 2, ["afile", "is a file"]),
    ("--out inside a file", ["--out", "{tmp}/afile/run"], 2, ["afile/run", "cannot create the run directory"]),
    ("alpha nan", ["algo.alpha=nan"], 2, ["algo.alpha=nan", "finite"]),
    ("lr inf", ["algo.lr=.inf"], 2, ["algo.lr=inf", "finite"]),
    ("K=1 in tree mode", ["rollout.K=1"], 2, ["rollout.K=1", "nothing is learned", "train.steps=0"]),
    ("bad override value", ["algo.lr=[1"], 2, ["algo.lr=[1", "not valid YAML"]),
    ("negative threads", ["train.threads=-1"], 2, ["train.threads=-1"]),
    ("user env module not found", ["env.name=no_such_pkg.envs:MyEnv"], 2,
     ["env.name='no_such_pkg.envs:MyEnv'", "cannot import 'no_such_pkg.envs'", "PYTHONPATH"]),
    ("unknown env name", ["env.name=nope"], 2, ["unknown environment 'nope'", "plan_path", "module:Class"]),
    ("per-role sampling for a role the env lacks", ["rollout.per_agent.coder.max_new_tokens=64"], 2,
     ["rollout.per_agent.coder", "not an agent of env 'plan_path'", "tool, plan"]),
    ("unknown logging backend", ["logging.backends=[neptune]"], 2,
     ["logging.backends[0]='neptune'", "tensorboard, wandb, mlflow"]),
    ("problem file without the needed columns",
     ["env.name=code", "env.style=compact", "env.kwargs.dataset=files", "env.kwargs.data_files={tmp}/problems.csv",
      "env.kwargs.roles=[coder]"], 2,
     ["missing columns 'inputs', 'outputs'", "the file has 'question', 'stdin', 'stdout'", "env.kwargs.columns"]),
    ("dump steps not integers", ["train.dump_rollouts=[1.5]"], 2, ["train.dump_rollouts[0]=1.5"]),
    ("two config files", ["{tmp}/list.yaml", "{tmp}/broken.yaml"], 2, ["broken.yaml", "one config file"]),
    ("resume a non-run", ["--resume", "{tmp}/adir"], 2, ["adir", "no config.yaml"]),
    ("unknown flag", ["--bogus"], 2, ["--bogus"]),
    # found only when the model is built: after the lock is taken, so these check that it leaves nothing
    ("model directory that does not load", ["model.kind=hf", "model.path={tmp}/badmodel"], 2,
     ["badmodel", "cannot be loaded"]),
    ("model directory that does not load, new --out", ["model.kind=hf", "model.path={tmp}/badmodel", "--out",
                                                       "{tmp}/new-out"], 2, ["badmodel", "cannot be loaded"]),
    ("Ray workers that do not fit",
     ["system.backend=ray", "system.ray.num_cpus=2", "system.ray.cpus_per_worker=1",
      "system.ray.cpus_per_env_worker=1"], 2, ["need 4 CPUs", "has 2", "system.ray.num_cpus=4"]),
    ("Ray GPUs this machine lacks", ["system.backend=ray", "system.ray.gpus_per_worker=64"], 2,
     ["system.ray.gpus_per_worker=64", "GPUs but this machine has"]),
]


def _scratch(root: str) -> None:
    os.makedirs(os.path.join(root, "adir"), exist_ok=True)
    with open(os.path.join(root, "list.yaml"), "w") as f:
        f.write("- seed: 1\n- rollout: {K: 2}\n")
    with open(os.path.join(root, "broken.yaml"), "w") as f:
        f.write("rollout:\n  K: 4\n  temperature: [1.0\ntrain:\n  steps: 2\n")
    with open(os.path.join(root, "afile"), "w") as f:
        f.write("not a model\n")
    with open(os.path.join(root, "problems.csv"), "w") as f:
        f.write('question,stdin,stdout\n"print n + 1","[""1\\n""]","[""2\\n""]"\n')
    os.makedirs(os.path.join(root, "badmodel"), exist_ok=True)
    with open(os.path.join(root, "badmodel", "config.json"), "w") as f:
        f.write('{"model_type": "no-such-architecture"}\n')


def _run(row, root: str) -> dict:
    name, args, _, _ = row
    cwd = os.path.join(root, "cwd-" + "".join(c if c.isalnum() else "_" for c in name))
    os.makedirs(cwd)
    args = [a.replace("{tmp}", root) for a in args]
    named = None
    if "--out" not in args and "--resume" not in args:
        named = os.path.join(cwd, "named-out")  # a directory the user made for the run: must stay empty
        os.makedirs(named)
        args += ["--out", named]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_HOME=root + "-hf-home")  # hub ids: an empty cache beside the scratch, no network
    proc = subprocess.run([sys.executable, "-m", "atgrpo.cli", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return {"rc": proc.returncode, "err": proc.stderr, "out": proc.stdout, "cwd": cwd, "named": named}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bad_input"))
    _scratch(root)
    before = {n: sorted(os.listdir(os.path.join(root, n))) if os.path.isdir(os.path.join(root, n)) else None
              for n in os.listdir(root)}
    rows = [r for r in ROWS if HAVE_RAY or not r[1][0].startswith("system.backend=ray")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        out = dict(zip([r[0] for r in rows], pool.map(lambda r: _run(r, root), rows)))
    after = {n: sorted(os.listdir(os.path.join(root, n))) if os.path.isdir(os.path.join(root, n)) else None
             for n in os.listdir(root) if not n.startswith("cwd-")}
    assert after == before, "a row changed the scratch files"  # nothing created next to the named paths
    return out


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_stops_before_work_with_one_line(results, row):
    name, args, status, names = row
    if name not in results:
        pytest.skip("ray is not installed")
    res = results[name]
    lines = [ln for ln in res["err"].splitlines() if ln.strip()]
    if "does not load" in name:  # the model library may log its own warning first
        lines = [ln for ln in lines if ln.startswith("atgrpo")]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{res['err'][-3000:]}"
    line = lines[0]
    assert "Traceback" not in res["err"] and line.startswith("atgrpo: "), line
    assert res["rc"] == status, (res["rc"], line)
    for s in names:
        assert s in line, (s, line)
    assert os.listdir(res["cwd"]) == (["named-out"] if res["named"] else []), os.listdir(res["cwd"])  # no runs/
    if res["named"]:
        assert os.listdir(res["named"]) == [], os.listdir(res["named"])  # not even a .lock


def test_debug_adds_the_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "atgrpo.cli", "train", "seed=abc", "--debug"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("atgrpo: config error:")
    assert os.listdir(tmp_path) == []


def test_k1_is_accepted_for_evaluation_only():
    from atgrpo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.K=1"):
        load_config(None, ["rollout.K=1"])
    assert load_config(None, ["rollout.K=1", "train.steps=0"]).rollout.K == 1
    assert load_config(None, ["rollout.K=1"], training=False).rollout.K == 1  # atgrpo eval
