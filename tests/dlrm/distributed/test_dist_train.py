"""Hybrid-parallel training (sharded embeddings + DDP dense part, gloo) at 2 and 4 ranks: the loss curve over
100 steps (60 at 4 ranks: 2 shared cores) equals one process training on the same global batches, for the dot
and the DCNv2 interactions."""

from __future__ import annotations

import pytest
import torch
from dist_workers import overlap_vs_plain, pipelined_vs_plain, train

from fuselab.dlrm.distributed import ParallelContext
from fuselab.dlrm.distributed.launch import spawn_local

STEPS, BATCH = {2: 100, 4: 60}, 16


def _single() -> ParallelContext:
    return ParallelContext(0, 1, 0, torch.device("cpu"), "none")


@pytest.mark.slow
@pytest.mark.parametrize("interaction", ["dot", "dcn"])
@pytest.mark.parametrize("world", [2, 4])
def test_loss_curve_equals_single_process(world, interaction):
    cfg = {"batch": BATCH, "steps": STEPS[world], "interaction": interaction}
    ref = torch.tensor(train(cfg, _single()))
    results = spawn_local(world, train, (cfg,))
    for r in range(world):  # every rank reports the global mean loss of each step
        torch.testing.assert_close(torch.tensor(results[r]), ref, rtol=1e-4, atol=1e-5)
    # the curve is informative: it moves, and a run on other data does not match it
    assert ref.std() > 1e-3
    assert ref[-15:].mean() < ref[:15].mean()


@pytest.mark.parametrize("world", [2, 4])
def test_overlapped_step_trains_like_the_plain_step(world):
    """build_hybrid's step with the lookup beside the bottom MLP (split forward, one flat all-reduce) against its
    step through DDP, 20 steps, bf16 (pooled rows and their gradients exchanged in bf16, ids as int32): the same
    losses, dense weights and shard rows on every rank. Bit for bit at 2 ranks (a/2 + b/2 = (a + b)/2 exactly); at 4
    the all-reduce's buckets differ (DDP's against one flat buffer), so fp32 sums may round differently."""
    results = spawn_local(world, overlap_vs_plain, ({"batch": 8, "steps": 20, "precision": "bf16"},))
    tol = dict(rtol=0, atol=0) if world == 2 else dict(rtol=1e-5, atol=1e-6)
    for rank in range(world):
        plain, overlapped = results[rank][False], results[rank][True]
        torch.testing.assert_close(torch.tensor(overlapped["losses"]), torch.tensor(plain["losses"]), **tol)
        for a, b in zip(overlapped["dense"] + overlapped["shards"], plain["dense"] + plain["shards"], strict=True):
            torch.testing.assert_close(a, b, **tol)
    assert results[0][False]["losses"][-1] != results[0][False]["losses"][0]


@pytest.mark.parametrize("world, kernels", [(1, "fuselab"), (2, "torch"), (3, "torch")])
def test_pipelined_step_trains_like_the_plain_step(world, kernels):
    """The next batch's ids sent during the step (pipeline) against the step that exchanges its own, 12 steps,
    one announcement skipped in the middle: the same losses, dense weights and shard rows bit for bit on every rank
    (the same ids reach the same lookups, only earlier), each batch's ids exchanged once, ahead of its step."""
    cfg = {"batch": 6, "steps": 12, "break_at": 5, "kernels": kernels}
    if world == 1:
        results = [pipelined_vs_plain(cfg, _single())]
    else:
        results = spawn_local(world, pipelined_vs_plain, (cfg,))
    for rank in range(world):
        plain, piped = results[rank][False], results[rank][True]
        # one exchange of ids per step either way; pipelined, every one through prefetch (the forward sent none)
        assert plain["counts"] == {"prefetch": 0, "exchange": 12}
        assert piped["counts"] == {"prefetch": 12, "exchange": 12}
        assert piped["losses"] == plain["losses"]
        for a, b in zip(piped["dense"] + piped["shards"], plain["dense"] + plain["shards"], strict=True):
            assert torch.equal(a, b)
    assert results[0][False]["losses"][-1] != results[0][False]["losses"][0]
