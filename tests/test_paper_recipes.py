"""configs/paper/: the paper's settings per task family and sharing level, as ``atgrpo.bench.paper_recipes``
writes them, each loadable (every key and the environment's kwargs checked) with a GPU layout that the memory plan
fits."""

from __future__ import annotations

import os

import pytest

from atgrpo.bench import paper_recipes as pr
from atgrpo.config.checks import validate_env
from atgrpo.config.loading import read_config
from atgrpo.config.schema import check_fields

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "paper")


@pytest.mark.parametrize("path, task, sharing", [(p, *ts) for p, ts in pr.paths(ROOT).items()],
                         ids=lambda x: os.path.basename(x) if isinstance(x, str) and x.endswith(".yaml") else None)
def test_each_recipe_is_current_loadable_and_fits_its_layout(path, task, sharing):
    with open(path) as f:
        assert f.read() == pr.text(task, sharing), f"{path} is stale: python -m atgrpo.bench.paper_recipes --write"
    cfg = read_config(path, [])
    check_fields(cfg)
    assert validate_env(cfg) == (1 if sharing == "L1" else 2)  # the policies: one shared, or one per role
    assert (cfg.rollout.K, cfg.rollout.problems_per_step, cfg.algo.lr, cfg.model.max_prompt_tokens,
            cfg.rollout.max_new_tokens, cfg.train.steps) == (8, 32, 1e-6, 4096, 2048, 200)
    gpus, rollout_workers, update_workers = pr.layout(pr.recipe(task, sharing))
    ray = cfg.system.ray
    assert (ray.num_rollout_workers, ray.num_update_workers) == (rollout_workers, update_workers)
    pools = 1 if sharing == "L1" else 2
    assert gpus == pools * (rollout_workers + update_workers)
    with open(path) as f:
        assert f"{gpus} GPUs, per policy {rollout_workers} rollout" in f.read()
