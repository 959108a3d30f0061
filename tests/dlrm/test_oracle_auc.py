"""The generator's shard and logit decomposition API, and benchmarks/dlrm_oracle_auc.py on a small dataset.

References are computed here from the written dataset (npy shards) and plain numpy, not from the script's code.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fuselab.dlrm.data.datasets import kaggle_split
from fuselab.dlrm.data.loader import open_dataset
from fuselab.dlrm.data.synth import SynthSpec, generate_shard, hidden_model, logit_parts

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dlrm_oracle_auc.py"
#: the spec of the ``synth_dir`` fixture (tests/dlrm/conftest.py)
SPEC = SynthSpec(rows=120_000, scale=2e-4, seed=1)
SHARD_ROWS = 50_000


@pytest.fixture(scope="module")
def oracle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dlrm_oracle_auc", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generate_shard_gives_the_written_rows(synth_dir):
    ds = open_dataset(synth_dir)
    model = hidden_model(SPEC)
    assert model.bias == ds.meta["synth"]["bias"] and model.cardinalities == ds.meta["cardinalities"]
    for index, start in enumerate(range(0, SPEC.rows, SHARD_ROWS)):
        stop = min(start + SHARD_ROWS, SPEC.rows)
        data = generate_shard(SPEC, model, index, stop - start)
        for key in ("dense", "sparse", "labels"):
            assert np.array_equal(data[key], ds.read_column(key, start, stop)), key
        assert np.array_equal(data["logit"].astype(np.float32), ds.read_column("truth", start, stop))


def test_logit_parts_rebuild_the_logit():
    model = hidden_model(SPEC)
    data = generate_shard(SPEC, model, 1, 3000)
    dense_term, id_terms = logit_parts(SPEC, model, data["dense"], data["sparse"])
    assert dense_term.shape == (3000,) and id_terms.shape == (3000, 26)
    expected_dense = data["dense"].astype(np.float64) @ model.params["dense_w"]
    np.testing.assert_allclose(dense_term, expected_dense, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.bias + dense_term + id_terms.sum(1), data["logit"], rtol=0, atol=1e-10)
    weights = model.params["sparse_w"]
    assert (weights == 0).any() and (weights > 0).any()
    assert not id_terms[:, weights == 0].any()
    # each term is its weight times a unit-variance uniform value of (feature, id): distinct ids, independent values
    ids = np.tile(np.arange(20_000), (26, 1)).T
    zero_term, terms = logit_parts(SPEC, model, np.zeros((20_000, 13), np.float32), ids)
    assert not zero_term.any()
    for f in np.flatnonzero(weights):
        g = terms[:, f] / weights[f]
        assert abs(g.mean()) < 0.05 and abs(g.std() - 1) < 0.02 and np.abs(g).max() <= np.sqrt(3) + 1e-12
    f1, f2 = np.flatnonzero(weights)[:2]
    assert abs(np.corrcoef(terms[:, f1], terms[:, f2])[0, 1]) < 0.05


def test_oracle_script_on_the_fixture(oracle, synth_dir, tmp_path, capsys):
    out = tmp_path / "oracle.json"
    args = ["--rows", str(SPEC.rows), "--scale", str(SPEC.scale), "--seed", str(SPEC.seed),
            "--shard-rows", str(SHARD_ROWS), "--thresholds", "1", "3", "10", "--out", str(out)]
    assert oracle.main(args) == 0
    result = json.loads(out.read_text())
    rows = {r["oracle"]: r for r in result["oracles"]}
    assert list(rows) == ["true", "seen>=1", "seen>=3", "seen>=10", "estimated", "dense only"]
    ds = open_dataset(synth_dir)
    split = kaggle_split(SPEC.rows)
    # true: the metadata's best test AUC (there from the stored float32 logits)
    assert abs(rows["true"]["auc"] - ds.meta["best_auc_test"]) < 1e-4
    # seen>=1: the share of test lookups whose id occurs in the train split, from the written shards
    weights = hidden_model(SPEC).params["sparse_w"]
    train = ds.read_column("sparse", *split["train"])
    test = ds.read_column("sparse", *split["test"])
    kept = np.stack([np.isin(test[:, f], train[:, f]) for f in range(26)], axis=1)
    assert rows["seen>=1"]["lookups_kept"] == pytest.approx(kept[:, weights > 0].mean(), abs=1e-12)
    coverage = (kept * weights**2).sum() / (weights**2).sum() / len(test)
    assert rows["seen>=1"]["coverage"] == pytest.approx(coverage, abs=1e-12)
    # an oracle with fewer true terms keeps less and ranks worse (rows of this size: by a wide margin for dense)
    kept_order = [rows[k]["coverage"] for k in ("true", "seen>=1", "seen>=3", "seen>=10", "dense only")]
    assert kept_order == sorted(kept_order, reverse=True) and kept_order[-1] == 0
    assert rows["dense only"]["auc"] + 0.1 < rows["estimated"]["auc"] < rows["true"]["auc"]
    assert rows["seen>=10"]["auc"] < rows["true"]["auc"]
    assert "seen>=3" in capsys.readouterr().out


def test_estimated_terms_are_the_map(oracle):
    """After the Newton steps the log-posterior's gradient of every id term is ~0 (sums over the train rows)."""
    spec = SynthSpec(rows=20_000, scale=1e-4, seed=3)
    collected = oracle.collect(spec, 8_000, newton_steps=4, log=lambda msg: None)
    model = hidden_model(spec)
    split = kaggle_split(spec.rows)
    data = [generate_shard(spec, model, k, min(8_000, spec.rows - s)) for k, s in enumerate(range(0, spec.rows, 8_000))]
    rows = {key: np.concatenate([d[key] for d in data])[split["train"][0]:split["train"][1]]
            for key in ("dense", "sparse", "labels", "logit")}
    _, id_terms = logit_parts(spec, model, rows["dense"], rows["sparse"])
    test_ids = collected["sparse"]
    for f in np.flatnonzero(model.params["sparse_w"])[:4]:
        variance = model.params["sparse_w"][f] ** 2
        theta = {}
        for i, estimate in zip(test_ids[:, f].tolist(), collected["estimated_terms"][:, f].tolist()):
            theta[i] = estimate
        for i, estimate in list(theta.items())[:20]:
            mask = rows["sparse"][:, f] == i
            logit = rows["logit"][mask] - id_terms[mask, f] + estimate
            gradient = (rows["labels"][mask] - 1 / (1 + np.exp(-logit))).sum() - estimate / variance
            assert abs(gradient) < 1e-6, (f, i, gradient)
            if not mask.any():
                assert estimate == 0


def test_oracle_script_errors(oracle, tmp_path):
    with pytest.raises(SystemExit):
        oracle.main(["--rows", "5"])
    assert oracle.main(["--rows", "100", "--scale", "3"]) == 2
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        oracle.main(["--rows", "100", "--out", str(tmp_path / "file" / "x.json")])
