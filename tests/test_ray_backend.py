"""The Ray backend on a local 2-CPU Ray cluster: the same train steps as the local backend (same seed: identical
rewards, losses equal up to float summation order), environment workers that die are replaced, a whole run
through ``train`` with ``system.backend=ray``.

One ``ray.init`` and one backend (2 per-role policies x (1 rollout + 2 update workers) + 2 environment workers)
are shared by the module: starting actors on 2 cores takes about a minute.
"""

import json
import os
import sys

import pytest
import torch

ray = pytest.importorskip("ray")

from atgrpo.config import ConfigError, load_config  # noqa: E402
from atgrpo.rollout.records import Sample  # noqa: E402
from atgrpo.trainer.run import train  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from atgrpo.trainer.step import train_step  # noqa: E402
from atgrpo.trainer.update import plan_minibatches, shard_minibatch, split_minibatches  # noqa: E402

from conftest import FAST  # noqa: E402
from ray_helpers import RAY, compare_metrics, module_backend  # noqa: E402

# the wrapper env below must reach the workers by value (they cannot import this test module)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# the module's backend (8 actors) and the run's (3 actors) at 1/8 CPU each
L3_DP = FAST + RAY + ["policy.sharing=L3", "system.ray.num_update_workers=2", "system.ray.num_env_workers=2"]
@pytest.fixture(scope="module")
def backend():
    yield from module_backend(L3_DP)


def _pair(backend, overrides):
    cfg = load_config(None, overrides)
    local, remote = build_state(cfg), build_state(cfg)
    remote.backend = backend
    return local, remote


def test_two_steps_match_the_local_backend(backend):
    """Two AT-GRPO steps, two per-role policies (L3), two data-parallel update workers per policy."""
    local, remote = _pair(backend, L3_DP)
    assert set(remote.policies) == {"plan", "tool"}
    for step in (1, 2):
        rl, rr = train_step(local, step), train_step(remote, step)
        ml, sl, mr, sr = rl.metrics(), rl.samples, rr.metrics(), rr.samples
        compare_metrics(ml, mr)
        assert [(s.problem, s.turn, s.agent, s.branch, s.response) for s in sl] == \
               [(s.problem, s.turn, s.agent, s.branch, s.response) for s in sr]
        assert mr["ray/dropped_samples"] == 0 and mr["ray/env_retries"] == 0
        for pid in local.policies:
            assert ml[f"update/{pid}/optimizer_steps"] > 0
    for pid in local.policies:  # the driver's copy holds the trained weights (synced after every update)
        a = dict(local.policies[pid].model.named_parameters())
        b = dict(remote.policies[pid].model.named_parameters())
        # data-parallel ranks sum the gradient in another order; AdamW moves a weight whose gradient is near zero
        # by up to lr (2e-4) on that rounding alone, so weights agree to a small fraction of lr
        assert all(torch.allclose(a[n], b[n], rtol=1e-4, atol=1e-5) for n in a), pid
    backend.pull_state(remote)  # optimizer states come back for checkpoints
    for pid in local.policies:
        sa, sb = local.optimizers[pid].state_dict()["state"], remote.optimizers[pid].state_dict()["state"]
        assert sa.keys() == sb.keys() and all(sa[i]["step"] == sb[i]["step"] for i in sa)


class KillWorkerOnce:
    """An environment whose first step in a process other than the driver, while ``flag`` exists, removes the
    flag and kills that process: an environment worker dying in the middle of a step."""

    def __init__(self, env, flag: str, driver_pid: int):
        self.env, self.flag, self.driver_pid = env, flag, driver_pid

    def __getattr__(self, name):
        if name.startswith("__") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def clone(self):
        return KillWorkerOnce(self.env.clone(), self.flag, self.driver_pid)

    def step(self, text):
        if os.getpid() != self.driver_pid and os.path.exists(self.flag):
            try:
                os.remove(self.flag)
            except FileNotFoundError:  # another worker took it
                return self.env.step(text)
            os._exit(1)
        return self.env.step(text)


def test_dead_environment_worker_is_replaced_and_its_work_retried(backend, tmp_path):
    local, remote = _pair(backend, L3_DP)
    flag = str(tmp_path / "kill-once")
    for st in (local, remote):
        make = st.make_env
        st.make_env = lambda split, seed, make=make: KillWorkerOnce(make(split, seed), flag, os.getpid())
    open(flag, "w").close()
    ml, mr = train_step(local, 1).metrics(), train_step(remote, 1).metrics()
    assert not os.path.exists(flag), "no environment worker stepped the wrapped env"
    assert mr["ray/env_worker_restarts"] == 1 and mr["ray/env_retries"] == 1
    assert mr["ray/dropped_samples"] == 0
    compare_metrics(ml, mr)
    ml = train_step(local, 2).metrics()  # the replacement worker serves the next step
    mr = train_step(remote, 2).metrics()
    compare_metrics(ml, mr)
    assert mr["ray/env_worker_restarts"] == 0


def _sample(prompt, n):
    return Sample(problem="p", branch=0, turn=0, agent="a", policy="a", prompt="", prompt_ids=list(prompt),
                  response="", response_ids=[1] * n, logprobs=[0.0] * n, reward_team=0.0, reward_local=0.0,
                  reward=0.0, selected=False, finished=True)


def test_shard_minibatch_keeps_prompt_groups_whole_and_loses_nothing():
    mb = [_sample((1, 2), 3), _sample((5,), 9), _sample((1, 2), 4), _sample((7, 7, 7), 1), _sample((5,), 2)]
    shards = shard_minibatch(mb, 2)
    assert sorted(map(id, mb)) == sorted(id(s) for sh in shards for s in sh)
    for sh in shards:
        prompts = {tuple(s.prompt_ids) for s in sh}
        assert all(sum(tuple(s.prompt_ids) == p for s in sh) == sum(tuple(s.prompt_ids) == p for s in mb)
                   for p in prompts)
    assert shard_minibatch(mb[:1], 3)[1:] == [[], []]
    # largest group (by tokens) first, each to the rank with the fewest tokens: (5,) 13, (1, 2) 11, (7, 7, 7) 4
    assert [[s.prompt_ids for s in sh] for sh in shard_minibatch(mb, 2)] == [[[5], [5]], [[1, 2], [1, 2], [7, 7, 7]]]


def test_one_minibatch_plan_for_the_local_and_the_data_parallel_update():
    """``plan_minibatches`` draws what ``split_minibatches`` draws (one randperm: the same generator state after);
    one rank trains on the mini-batches as split, several on each mini-batch's whole-group shards."""
    from atgrpo.config import AlgoConfig

    samples = [_sample((p,) * (1 + p % 3), 1 + (p * 7 + k) % 5) for p in range(7) for k in range(3)]
    mbs = split_minibatches(samples, 3, g := torch.Generator().manual_seed(5))

    def ids(nested):
        return [[[id(s) for s in part] for part in rank] for rank in nested]

    for world in (1, 2, 3):
        plan = plan_minibatches(samples, AlgoConfig(minibatches=3), gp := torch.Generator().manual_seed(5), world)
        assert torch.equal(gp.get_state(), g.get_state()) and plan.n_samples == len(samples)
        assert plan.normalizers == [float(sum(len(s.response_ids) for s in mb)) for mb in mbs]  # token-mean
        want = [mbs] if world == 1 else [[shard_minibatch(mb, world)[r] for mb in mbs] for r in range(world)]
        assert ids(plan.shards) == ids(want)


def test_config_names_the_backend_choices():
    with pytest.raises(ConfigError, match="system.backend"):
        load_config(None, ["system.backend=slurm"])
    with pytest.raises(ConfigError, match="num_update_workers"):
        load_config(None, ["system.ray.num_update_workers=0"])


def test_train_run_on_ray_writes_metrics_and_checkpoint(backend, tmp_path):
    """A whole ``train`` run (L1: one shared policy) through the run loop's hooks: its own backend on the
    running Ray instance, closed at the end; optimizer states pulled back for the checkpoint."""
    out = tmp_path / "run"
    summary = train(load_config(None, FAST + RAY + ["system.ray.num_env_workers=1", "eval.problems=2"]),
                    str(out), progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert [r["step"] for r in rows][:2] == [1, 2] and all(r["ray/dropped_samples"] == 0 for r in rows[:2])
    assert summary["steps"] == 2
    blob = torch.load(out / "checkpoint" / "step_2" / "trainer_state.pt", weights_only=False)
    steps = {int(s["step"]) for s in blob["optimizers"]["shared"]["state"].values()}
    assert steps == {rows[0]["update/shared/optimizer_steps"] + rows[1]["update/shared/optimizer_steps"]}
