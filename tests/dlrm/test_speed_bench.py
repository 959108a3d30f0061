"""benchmarks/dlrm_speed.py: the CPU smoke run, its facebookresearch/dlrm-style baseline, its inputs and cases.

The baseline's dot interaction keeps the strict lower triangle row-major, ``[x, Z[1,0], Z[2,0], Z[2,1], ...]``,
which is fuselab's ``InteractionArch`` order, so with the same weights both models give the same probabilities.
"""

from __future__ import annotations

import json
from types import ModuleType

import pytest
import torch
from bench_scripts import load_benchmark
from dlrm_fake_ops import fuselab_ops  # noqa: F401  (a fixture)
from torch import nn

from fuselab.dlrm.model import DLRM, InteractionArch
from fuselab.testing import assert_close


@pytest.fixture(scope="module")
def speed() -> ModuleType:
    return load_benchmark("dlrm_speed")


@pytest.mark.usefixtures("fuselab_ops")
def test_cpu_quick_run_writes_every_provider(speed, tmp_path):
    assert speed.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "dlrm_speed.json").read_text())
    assert result["status"] == "done" and result["shapes"]["dim"] == 16
    runs = result["runs"]
    assert {(r["provider"], r["precision"]) for r in runs} == {
        (p, q) for p in ("fb-eager", "torch-eager", "fuselab-eager") for q in ("bf16", "fp32")}
    for r in runs:
        assert r["status"] == "ok", r
        assert r["samples_per_s"] > 0 and len(r["step_ms_windows"]) == 1 and r["batch"] == 64
        assert set(r["breakdown_ms"]) == set(speed.PIECES) and sum(r["breakdown_ms"].values()) > 0
        assert r["kernels_per_step"] == 0  # no CUDA kernels on a CPU


def test_fb_interaction_order_is_fuselab_order(speed):
    torch.manual_seed(0)
    model = speed.FbDLRM([3] * 26, "cpu")
    x, emb = torch.randn(9, 16), torch.randn(9, 26, 16)
    ours = InteractionArch(26, 16, "dot")(x, emb)
    torch.testing.assert_close(model.interact(x, list(emb.unbind(1))), ours, rtol=0, atol=0)


def test_fb_model_with_our_weights_gives_our_probabilities(speed):
    torch.manual_seed(1)
    sizes = [7, 1, 130, 33, 5] + [2] * 21
    ours = DLRM(sizes, 16, speed.BOTTOM, speed.TOP, embedding_layout="per_table", seed=3).eval()
    fb = speed.FbDLRM(sizes, "cpu")
    with torch.no_grad():
        for k, bag in enumerate(fb.emb_l):
            bag.weight.copy_(ours.sparse_arch.tables[k].weight)
        for mine, theirs in ((ours.dense_arch.mlp, fb.bot_l), (ours.over_arch.mlp, fb.top_l)):
            for a, b in zip([m for m in mine if isinstance(m, nn.Linear)],
                            [m for m in theirs if isinstance(m, nn.Linear)], strict=True):
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)
    dense = torch.rand(11, 13)
    ids = torch.stack([torch.randint(0, n, (11,)) for n in sizes], dim=1)
    with torch.no_grad():
        prob = fb.top_l(fb.interact(fb.bot_l(dense), fb.lookup(ids)))[:, 0]
        assert_close(prob, torch.sigmoid(ours(dense, ids)).double(), torch.float32, "fb-style vs fuselab")


def test_fb_step_trains_with_sparse_sgd(speed):
    torch.manual_seed(2)
    sizes = [5] * 26
    step = speed.FbStep(speed.FbDLRM(sizes, "cpu"), "fp32", "eager")
    dense, ids, labels = speed.make_batches(speed.Case(32, "uniform", "fp32"), sizes, torch.device("cpu"), 1)[0]
    before = step.model.emb_l[3].weight.detach().clone()
    losses = [step(dense, ids, labels) for _ in range(20)]
    assert step.model.emb_l[3].weight.grad.is_sparse and not torch.equal(step.model.emb_l[3].weight, before)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("ids", ["powerlaw", "uniform"])
def test_batches_in_range_and_power_law_skewed(speed, ids):
    sizes = [3, 1000, 50_000]
    batches = speed.make_batches(speed.Case(4096, ids, "fp32"), sizes, torch.device("cpu"), 2)
    for dense, sparse, labels in batches:
        assert dense.shape == (4096, 13) and labels.shape == (4096,) and sparse.dtype == torch.int64
        for t, n in enumerate(sizes):
            assert int(sparse[:, t].min()) >= 0 and int(sparse[:, t].max()) < n
    top_share = torch.unique(batches[0][1][:, 2], return_counts=True)[1].max().item() / 4096
    assert top_share > 0.05 if ids == "powerlaw" else top_share < 0.01


def test_lean_cases(speed):
    cases = speed.lean_cases([8192, 65536])
    assert cases[0] == speed.Case(65536, "powerlaw", "bf16")
    assert {(c.ids, c.precision) for c in cases if c.batch == 65536} == {
        (i, p) for i in ("powerlaw", "uniform") for p in ("fp32", "tf32", "bf16")}
    assert {(c.ids, c.precision) for c in cases if c.batch == 8192} == {("powerlaw", "bf16"), ("powerlaw", "fp32")}
