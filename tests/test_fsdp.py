"""The sharded update (atgrpo/trainer/fsdp.py) equals the single-process one.

Two gloo processes (torch.multiprocessing, CPU) each shard a tiny Llama with FSDP2 and run their part of one PPO
epoch planned by ``plan_minibatches(..., world=2)``; the plan has a mini-batch with an empty shard on one rank
and ranks with unequal micro-batch counts (the equal-pass rule). The full updated weights and AdamW's moments
(gathered with ``torch.distributed.checkpoint.state_dict``) and the statistics of every rank are compared with
``update_policy`` on the same samples and generator, with shared-prefix scoring on and off, KL penalty on and
off. One spawn runs every case.
"""

from __future__ import annotations

import copy
import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from atgrpo.config import AlgoConfig
from atgrpo.policies import ByteTokenizer, CausalLMPolicy, TinyModelConfig, build_tiny_model
from atgrpo.rollout.records import Sample
from atgrpo.trainer.update import make_optimizer, micro_batches, plan_minibatches, update_policy

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
# (shared_prefix, kl_coef, gradient checkpointing): both scoring paths; the KL reference stays a full copy on
# every rank; checkpointed layers recompute the prefix tree under FSDP (the reference update is unchecked)
CASES = [(True, 0.0, False), (False, 0.05, False), (True, 0.0, True)]
SEED = 3


def _algo(shared: bool, kl: float, checkpointing: bool = False) -> AlgoConfig:
    return AlgoConfig(shared_prefix=shared, kl_coef=kl, minibatches=3, micro_batch_size=2, update_token_budget=60,
                      lr=1e-2, grad_clip=0.5)


def _policy(seed: int = 0) -> CausalLMPolicy:
    return CausalLMPolicy("p", build_tiny_model(TINY, seed), ByteTokenizer())


def _samples() -> list[Sample]:
    """Prompt groups of 3, 1, 5 and 2 responses (lengths 1..9), old log-probs of the initial model, random
    advantages: 4 groups in 3 mini-batches, so two mini-batches hold one group and one rank nothing."""
    g = torch.Generator().manual_seed(9)
    policy, out = _policy(), []
    for j, (lp, k) in enumerate(((11, 3), (25, 1), (6, 5), (9, 2))):
        p = [1] + torch.randint(3, 259, (lp - 1,), generator=g).tolist()
        rs = [torch.randint(2, 259, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g).tolist()
              for _ in range(k)]
        with torch.no_grad():
            old, _ = policy.response_logprobs([p] * k, rs, 1.0)
        out += [Sample(problem=str(j), branch=i, turn=0, agent="a", policy="p", prompt="", prompt_ids=p, response="",
                       response_ids=r, logprobs=old[i, :len(r)].tolist(), reward_team=0.0, reward_local=0.0,
                       reward=0.0, selected=False, finished=True, advantage=float(torch.randn(1, generator=g)))
                for i, r in enumerate(rs)]
    return out


def _rank(rank: int, port: int, samples: list[Sample], out_dir: str) -> None:
    """One rank, for each case: two updates (two plans from one generator), each on a fresh sharded model of
    another seed loaded with the state the previous one left (``load_full_state``; the first gets the initial
    weights and an empty optimizer state), as a Ray update worker is loaded at attach and resume."""
    from atgrpo.policies.cascade import enable_checkpointing
    from atgrpo.trainer.fsdp import (full_optimizer_state, full_trainable_state, load_full_state, shard_model,
                                     sharded_epoch_update)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = []
        for shared, kl, checkpointing in CASES:
            algo, gen = _algo(shared, kl), torch.Generator().manual_seed(SEED)
            initial = _policy()
            reference = copy.deepcopy(initial) if kl > 0 else None
            weights = dict(initial.model.named_parameters())
            moments = make_optimizer(initial, algo).state_dict()
            stats = []
            for _ in range(2):
                box = [(weights, moments)]
                dist.broadcast_object_list(box, src=0)  # rank 0's state to every rank (the driver's copy)
                weights, moments = box[0]
                policy = _policy(seed=1)
                if checkpointing:
                    enable_checkpointing(policy.model)
                shard_model(policy.model)
                assert policy.model.model.layers[0].gradient_checkpointing == checkpointing
                optimizer = make_optimizer(policy, algo)
                load_full_state(policy, optimizer, {n: w.detach() for n, w in weights.items()}, moments)
                plan = plan_minibatches(samples, algo, gen, world=2)
                stats.append(sharded_epoch_update(policy, optimizer, plan.shards[rank], plan.normalizers,
                                                  plan.n_samples, algo, 1.0, reference))
                weights, moments = full_trainable_state(policy.model), full_optimizer_state(policy, optimizer)
                assert rank == 0 or (weights == {} and moments == {})
            results.append((stats, weights, moments))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded():
    samples = _samples()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank, args=(port, samples, d), nprocs=2, join=True)
        return samples, [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(2)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_sharded_update_equals_the_single_process_update(sharded, case):
    samples, ranks = sharded
    algo = _algo(*CASES[case])
    plan = plan_minibatches(samples, algo, torch.Generator().manual_seed(SEED), world=2)
    assert any(not sh for shards in plan.shards for sh in shards), "no rank has an empty shard"
    counts = [[len(micro_batches(sh, algo)) for sh in shards] for shards in plan.shards]
    assert counts[0] != counts[1], "the ranks run the same micro-batch counts: the padding is not exercised"

    policy = _policy()
    reference = copy.deepcopy(policy) if algo.kl_coef > 0 else None
    optimizer, gen = make_optimizer(policy, algo), torch.Generator().manual_seed(SEED)
    want = [update_policy(policy, optimizer, samples, algo, 1.0, gen, reference) for _ in range(2)]

    stats, weights, moments = ranks[0][case]
    assert ranks[1][case][0] == stats  # every rank reports the same
    for got, exp in zip(stats, want):
        assert exp.optimizer_steps == 3 and exp.grad_norm > algo.grad_clip  # clipping ran (on the global norm)
        for k in ("optimizer_steps", "tokens", "samples", "skipped_nonfinite"):
            assert getattr(got, k) == getattr(exp, k), k
        for k in ("loss", "grad_norm", "clipfrac", "approx_kl"):
            assert getattr(got, k) == pytest.approx(getattr(exp, k), rel=1e-5, abs=1e-7), k
        if algo.kl_coef > 0:
            assert got.ref_kl == pytest.approx(exp.ref_kl, rel=1e-5, abs=1e-7)
        else:
            assert got.ref_kl is None and exp.ref_kl is None

    names = dict(policy.model.named_parameters())
    assert set(weights) == set(names)
    initial = dict(_policy().model.named_parameters())
    assert max(float((weights[n] - p.detach()).abs().max()) for n, p in initial.items()) > 1e-3  # it trained
    for n, p in names.items():
        torch.testing.assert_close(weights[n], p.detach(), atol=1e-5, rtol=1e-5, msg=n)
    exp = optimizer.state_dict()
    def groups(sd):  # betas come back a list
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in sd["param_groups"]]

    assert groups(moments) == groups(exp) and moments["state"].keys() == exp["state"].keys()
    for i, st in exp["state"].items():
        assert float(moments["state"][i]["step"]) == float(st["step"]) == 6
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(moments["state"][i][k], st[k], atol=1e-6, rtol=1e-4, msg=f"{i} {k}")
