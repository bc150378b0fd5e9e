"""The Ray backend with sharded update workers (``system.ray.update_sharding=fsdp``, atgrpo/trainer/fsdp.py) on a
local 2-CPU Ray cluster: two AT-GRPO steps equal the local backend's (as tests/test_ray_backend.py checks for
replicated workers), and the optimizer states read out of the shards equal the local ones. The config refuses
the combinations that are not tested.
"""

import pytest
import torch

ray = pytest.importorskip("ray")

from atgrpo.config import ConfigError, load_config  # noqa: E402
from atgrpo.trainer.state import build_state  # noqa: E402
from atgrpo.trainer.step import train_step  # noqa: E402

from conftest import FAST  # noqa: E402
from ray_helpers import RAY, compare_metrics, module_backend  # noqa: E402

# two per-role policies (L3), each sharded over two update workers: 2 x (1 + 2) + 2 actors at 1/8 CPU each
FSDP = FAST + RAY + ["policy.sharing=L3", "system.ray.num_update_workers=2", "system.ray.num_env_workers=2",
                     "system.ray.update_sharding=fsdp"]


@pytest.fixture(scope="module")
def backend():
    yield from module_backend(FSDP)


def test_two_sharded_steps_match_the_local_backend(backend):
    cfg = load_config(None, FSDP)
    local, remote = build_state(cfg), build_state(cfg)
    remote.backend = backend
    for step in (1, 2):
        ml, mr = train_step(local, step).metrics(), train_step(remote, step).metrics()
        compare_metrics(ml, mr)
        assert mr["ray/dropped_samples"] == 0
        assert all(ml[f"update/{pid}/optimizer_steps"] > 0 for pid in local.policies)
    for pid, pool in backend.pools.items():  # the workers did hold shards (DTensor parameters), not replicas
        kinds = ray.get([w.__ray_call__.remote(lambda self: type(next(self.policy.model.parameters())).__name__)
                         for w in pool.update])
        assert kinds == ["DTensor", "DTensor"], (pid, kinds)
    for pid in local.policies:  # the driver's copy holds the full trained weights, gathered from the shards
        a = dict(local.policies[pid].model.named_parameters())
        b = dict(remote.policies[pid].model.named_parameters())
        # data-parallel ranks sum the gradient in another order; AdamW moves a weight whose gradient is near zero
        # by up to lr (2e-4) on that rounding alone, so weights agree to a small fraction of lr
        assert all(torch.allclose(a[n], b[n], rtol=1e-4, atol=1e-5) for n in a), pid
    backend.pull_state(remote)  # the full optimizer states, in the unsharded format of a checkpoint
    for pid in local.policies:
        sa, sb = local.optimizers[pid].state_dict()["state"], remote.optimizers[pid].state_dict()["state"]
        assert sa.keys() == sb.keys() and all(float(sa[i]["step"]) == float(sb[i]["step"]) for i in sa)
        for i in sa:
            torch.testing.assert_close(sb[i]["exp_avg"], sa[i]["exp_avg"], rtol=1e-3, atol=1e-6)


def test_config_update_sharding():
    assert load_config(None, []).system.ray.update_sharding == "replicate"
    with pytest.raises(ConfigError, match="update_sharding"):
        load_config(None, ["system.ray.update_sharding=zero3"])
    with pytest.raises(ConfigError, match="policy.sharing=L2"):
        load_config(None, ["system.ray.update_sharding=fsdp", "policy.sharing=L2"])
    both = load_config(None, ["system.ray.update_sharding=fsdp", "model.gradient_checkpointing=true"])
    assert both.model.gradient_checkpointing  # tested together in tests/test_fsdp.py
