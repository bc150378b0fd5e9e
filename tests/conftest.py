import os

import pytest

# Small, fast settings shared by the end-to-end tests: a tiny model, few problems, short warm start.
FAST = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
    "rollout.K=4", "rollout.problems_per_step=4", "rollout.max_new_tokens=8", "warmstart.episodes=8",
    "warmstart.epochs=1", "eval.problems=6", "train.steps=2", "train.tensorboard=false", "train.plot=false",
]


@pytest.fixture
def fast_overrides():
    return list(FAST)


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # runs in the tests compare rows exactly: a fixed thread count, not one chosen from the load (train.threads=0)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
