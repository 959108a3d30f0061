"""benchmarks/dlrm_gpu.py and its baseline (benchmarks/dlrm_baseline.py), on the CPU in a few seconds.

The baseline re-creates facebookresearch/dlrm's model; its dot interaction keeps the strict lower triangle
row-major, ``[x, Z[1,0], Z[2,0], Z[2,1], ...]``, which is also fuselab's ``InteractionArch`` order (the mapping
is the identity), so given the same weights both models give the same probabilities.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.loader import BatchLoader, Hasher, kaggle_split, open_dataset
from fuselab.dlrm.model import DLRM, InteractionArch
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.runtime import PHASES, PhaseTimer
from fuselab.testing import assert_close

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SIZES = [7, 1, 130, 33, 5]


@pytest.fixture(scope="module")
def bench() -> dict[str, ModuleType]:
    """The benchmark modules (they import each other by name, as when run as a script).

    ``dlrm_harness`` and ``dlrm_gpu`` are present only when they import (they follow the trainer's modules:
    ``Optimizers`` in ``fuselab.dlrm.optim``, ``TrainStep`` in ``fuselab.dlrm.step``, ``PhaseTimer`` in
    ``fuselab.dlrm.runtime``); the tests that need them skip, naming the import error, until they do.
    """
    sys.path.insert(0, str(BENCH))
    try:
        modules = {"dlrm_baseline": importlib.import_module("dlrm_baseline")}
        for name in ("dlrm_harness", "dlrm_gpu"):
            try:
                modules[name] = importlib.import_module(name)
            except ImportError as err:
                modules[name + ".error"] = err  # type: ignore[assignment]
        return modules
    finally:
        sys.path.remove(str(BENCH))


def _need(bench: dict[str, ModuleType], *names: str) -> None:
    for name in names:
        if name not in bench:
            pytest.skip(f"benchmarks/{name}.py does not import with the current trainer modules: "
                        f"{bench[name + '.error']}")


def _ids(batch: int, sizes: list[int]) -> torch.Tensor:
    return torch.stack([torch.randint(0, n, (batch,)) for n in sizes], dim=1)


def test_interaction_order_is_fuselab_dot_order(bench):
    torch.manual_seed(0)
    features, dim = 26, 16
    x, emb = torch.randn(9, dim), torch.randn(9, features, dim)
    ref = bench["dlrm_baseline"].ReferenceDLRM([3] * features, dim, [13, dim], [dim + 351, 1])
    out = ref.interact_features(x, list(emb.unbind(1)))
    ours = InteractionArch(features, dim, "dot")(x, emb)
    assert out.shape == ours.shape == (9, ref.interaction_width(features, dim))
    torch.testing.assert_close(out, ours, rtol=0, atol=0)


def test_same_weights_same_probabilities(bench):
    torch.manual_seed(1)
    cfg = load_config("tiny", embedding_layout="per_table")
    ours = DLRM.from_config(cfg, SIZES).eval()
    base = bench["dlrm_baseline"]
    ref = base.ReferenceDLRM.from_config(cfg, SIZES)
    with torch.no_grad():
        for k, bag in enumerate(ref.emb_l):
            bag.weight.copy_(ours.sparse_arch.tables[k].weight)
        for mine, theirs in ((ours.dense_arch.mlp, ref.bot_l), (ours.over_arch.mlp, ref.top_l)):
            pairs = zip([m for m in mine if isinstance(m, nn.Linear)], [m for m in theirs if isinstance(m, nn.Linear)],
                        strict=True)
            for a, b in pairs:
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)
    assert isinstance(ref.top_l[-1], nn.Sigmoid) and all(not isinstance(m, nn.Sigmoid) for m in ref.bot_l)
    dense, ids = torch.rand(17, 13), _ids(17, SIZES)
    prob = ref(dense, *base.reference_inputs(ids))
    assert prob.shape == (17, 1)
    assert_close(prob[:, 0], torch.sigmoid(ours(dense, ids)), torch.float32, "reference vs fuselab")


def test_reference_training_step_sparse_sgd(bench):
    torch.manual_seed(2)
    base = bench["dlrm_baseline"]
    cfg = load_config("tiny")
    trainer = base.ReferenceTrainer(base.ReferenceDLRM.from_config(cfg, SIZES), lr=0.1)
    dense, ids, labels = torch.rand(64, 13), _ids(64, SIZES), (torch.rand(64) < 0.3).float()
    before = trainer.model.emb_l[2].weight.detach().clone()
    timer = PhaseTimer(torch.device("cpu"), enabled=True)
    losses = [float(trainer.step(dense, ids, labels, timer)) for _ in range(30)]
    assert trainer.model.emb_l[2].weight.grad.is_sparse
    untouched = torch.ones(SIZES[2], dtype=torch.bool)
    untouched[ids[:, 2]] = False
    torch.testing.assert_close(trainer.model.emb_l[2].weight[untouched], before[untouched], rtol=0, atol=0)
    assert not torch.equal(trainer.model.emb_l[2].weight, before)
    assert losses[-1] < losses[0]
    assert trainer.samples == 30 * 64 and 0 <= trainer.correct <= trainer.samples
    assert all(timer.totals[p] > 0 for p in ("forward", "backward", "optimizer"))


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_measure_runs_both_providers(bench, synth_dir):
    _need(bench, "dlrm_harness")
    harness, base = bench["dlrm_harness"], bench["dlrm_baseline"]
    cfg = load_config("tiny")
    ds = open_dataset(synth_dir)
    device = torch.device("cpu")
    hasher = Hasher(ds.cardinalities)
    model = DLRM.from_config(cfg, ds.cardinalities)
    opts = Optimizers(model, optimizer=cfg.optimizer, lr_dense=cfg.lr_dense, lr_sparse=cfg.lr_sparse)
    steps = {"fuselab": harness.fuselab_step(model, hasher, opts, cfg, device),
             "baseline": harness.baseline_step(base.ReferenceTrainer(base.ReferenceDLRM.from_config(
                 cfg, ds.cardinalities)), hasher)}
    for step in steps.values():
        loader = BatchLoader(ds, *kaggle_split(len(ds))["train"], 512, device, "batch", drop_last=True)
        batches = harness.cycle(loader)
        res = harness.measure(step, batches, device, batch_size=512, warmup=1, breakdown_steps=2, max_steps=3,
                              window_s=30, log=print)
        batches.close()
        assert res["steps"] == 3 and res["samples"] == 3 * 512 and res["train_samples"] == 6 * 512
        assert res["samples_per_s"] > 0 and res["step_ms_median"] > 0
        assert set(res["breakdown_ms"]) == set(PHASES) and res["breakdown_ms"]["forward"] > 0


def test_profiles_fit_the_brief(bench, tmp_path):
    _need(bench, "dlrm_gpu")
    gpu = bench["dlrm_gpu"]
    _, full = gpu.parse_args(["--out", str(tmp_path)])
    assert full.name == "full" and full.scale == 1.0 and full.batch_sizes == (8192, 65536)
    assert full.long_samples >= 20_000_000 and full.rows >= 20_000_000
    train = kaggle_split(full.rows)["train"]
    assert train[1] - train[0] >= full.long_samples  # the long run sees each sample once
    assert full.budget_s <= 480 and full.hard_s <= 550  # about 8 minutes; always inside 9.5
    _, quick = gpu.parse_args(["--out", str(tmp_path), "--quick"])
    _, small = gpu.parse_args(["--out", str(tmp_path), "--rows", "500000"])
    assert quick.name == small.name == "quick" and small.rows == 500_000 and quick.scale < 0.01
