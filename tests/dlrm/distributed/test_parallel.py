"""Per-rank batch slicing, the one-rank context, the launcher's argument list, local module contract."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from dlrm_models import tiny_model

from fuselab.core.embedding_optimizer import SGD
from fuselab.dlrm.distributed import (
    DenseParts,
    DistributedDLRM,
    ShardedEmbeddingCollection,
    fused_factory,
    gather_rows,
    init_from_env,
    local_rows,
    local_slice,
    plan_sharding,
    slice_bags,
    slice_batch,
    torch_factory,
)
from fuselab.dlrm.distributed.launch import main, spawn_local, torchrun_argv
from fuselab.dlrm.sparse import FusedEmbeddingCollection, TorchEmbeddingCollection


@pytest.mark.parametrize("batch,world", [(16, 4), (10, 4), (7, 2), (5, 5), (1, 1)])
def test_local_slices_partition_the_batch(batch, world):
    parts = [local_slice(batch, r, world) for r in range(world)]
    assert parts[0].start == 0 and parts[-1].stop == batch
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    sizes = [p.stop - p.start for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_gather_rows_one_process():
    x = torch.arange(6).view(3, 2)
    assert gather_rows(x) is x


def test_local_rows_and_errors():
    assert local_rows(2, 10, 1, 2, 100) == (25, 30)
    assert local_rows(9, 10, 0, 2, 95) == (90, 93)  # short last batch
    with pytest.raises(ValueError, match="past"):
        local_rows(10, 10, 0, 2, 100)
    with pytest.raises(ValueError, match="fewer rows"):
        local_slice(3, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        local_slice(8, 4, 4)


@dataclass
class _Batch:
    dense: torch.Tensor
    labels: torch.Tensor


def test_slice_batch_and_bags():
    batch = _Batch(torch.arange(20.0).view(10, 2), torch.arange(10.0))
    part = slice_batch(batch, 1, 3)
    assert torch.equal(part.labels, torch.tensor([4.0, 5.0, 6.0])) and part.dense.shape == (3, 2)
    assert torch.equal(slice_batch({"x": torch.arange(4)}, 1, 2)["x"], torch.tensor([2, 3]))
    with pytest.raises(TypeError, match="cannot slice"):
        slice_batch(3, 0, 1)
    # 3 samples x 2 features, bag lengths 1,0,2,1,3,1
    ids = torch.arange(8)
    offsets = torch.tensor([0, 1, 1, 3, 4, 7, 8])
    got_ids, got_off = slice_bags(ids, offsets, 2, 1, 2)  # rank 1 of 2 holds sample 2
    assert torch.equal(got_ids, torch.tensor([4, 5, 6, 7])) and torch.equal(got_off, torch.tensor([0, 3, 4]))


def test_single_process_context(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)  # restored after the test
    ctx = init_from_env()
    assert (ctx.rank, ctx.world_size, ctx.embedding_group) == (0, 1, None) and ctx.is_main
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK"):
        init_from_env()


def test_nccl_with_more_ranks_than_gpus_is_named(monkeypatch):
    """NCCL on a host with fewer GPUs than local ranks: a ValueError naming LOCAL_RANK and the GPU count, before
    any CUDA call (not CUDA's "invalid device ordinal")."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):  # set by the call: restored after the test
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=1 needs GPU 1, but this host has 1"):
        init_from_env(backend="nccl")


def test_launcher_argv():
    assert torchrun_argv(4, ["dlrm", "train", "--config", "tiny"]) == [
        "--standalone", "--nproc-per-node=4", "-m", "fuselab", "dlrm", "train", "--config", "tiny"]
    with pytest.raises(ValueError, match="nproc"):
        torchrun_argv(0, [])
    with pytest.raises(SystemExit):
        main(["--help"])


@pytest.mark.parametrize("factory, kind", [(torch_factory, TorchEmbeddingCollection),
                                           (fused_factory, FusedEmbeddingCollection)])
def test_local_module_contract(factory, kind):
    mod = factory([3, 2], 2, optimizer=SGD(), lr=1.0)
    assert isinstance(mod, kind) and mod.capturable == (kind is FusedEmbeddingCollection)
    with torch.no_grad():
        mod.weight.copy_(torch.arange(10.0).view(5, 2))
    ids, offsets = torch.tensor([0, 2, 1, 1]), torch.tensor([0, 2, 3, 4, 4])  # 2 samples x 2 shards
    out = mod(ids, offsets)
    assert torch.equal(out, torch.tensor([[[4.0, 6.0], [8.0, 9.0]], [[2.0, 3.0], [0.0, 0.0]]]))
    out.sum().backward()  # sgd lr 1: each looked-up row decreases by its count
    assert mod.grad_anchor.grad is None
    assert torch.equal(mod.weight[:, 0], torch.tensor([-1.0, 1.0, 3.0, 6.0, 7.0]))
    with pytest.raises(TypeError, match="optimizer"):
        factory([3], 2, optimizer="adagrad")


def test_dense_parts_of_the_project_dlrm():
    sizes = [5, 9, 3]
    model = tiny_model(sizes, top_mlp=[8, 1], seed=2)
    parts = DenseParts(model)
    assert {id(p) for p in parts.parameters()} == {id(p) for p in model.dense_parameters()}
    sparse = ShardedEmbeddingCollection(plan_sharding(sizes, 4, 1), 0, factory=torch_factory)
    wrapped = DistributedDLRM(sparse, parts)
    dense, ids = torch.rand(6, 13), torch.randint(0, 100, (6, 3))
    emb = sparse(ids)
    torch.testing.assert_close(wrapped(dense, ids), model.dense_forward(dense, emb), rtol=0, atol=0)
    assert wrapped.dense is parts  # one process: no DDP wrapper
    with pytest.raises(TypeError, match="no module 'dense_arch'"):
        DenseParts(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_launcher_runs_a_module_in_n_processes(tmp_path):
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[2] / "src"), str(here)])}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "fuselab.dlrm.distributed.launch", "--nproc", "2", "--module", "dist_main", "--",
           str(tmp_path)]
    subprocess.run(cmd, env=env, check=True, timeout=120, capture_output=True)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got == {"world": 2, "sum": 3.0, "backend": "gloo", "rows": [[0, 0], [1, 1], [1, 1]]}


def test_spawn_local_gives_back_the_callers_signal_handlers():
    """torch's elastic agent installs handlers that raise instead of ending the process and leaves them installed;
    a pool forked afterwards could then not stop its workers with SIGTERM."""

    def mine(signum, frame):
        pass

    watched = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    before = {sig: signal.getsignal(sig) for sig in watched}
    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGHUP, mine)
    try:
        assert spawn_local(1, os.getpid)[0] != os.getpid()
        after = {sig: signal.getsignal(sig) for sig in watched}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert after == {**before, signal.SIGTERM: mine, signal.SIGHUP: mine}


def test_abort_leaves_the_group_without_the_peers(tmp_path, monkeypatch):
    """A failed rank's exit: gloo's group destroyed (local), NCCL's communicators aborted instead of the orderly
    destroy that waits for peers; nothing to do without a group."""
    import torch.distributed as dist

    from fuselab.dlrm.distributed.parallel import abort

    abort()  # no group: no-op
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    aborted: list[bool] = []
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda: aborted.append(True))
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    abort()
    assert aborted == [True] and dist.is_initialized()  # the NCCL branch (stubbed) left the group alone
    monkeypatch.undo()
    abort()
    assert not dist.is_initialized()
