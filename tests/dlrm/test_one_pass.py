"""benchmarks/dlrm_one_pass.py: its learners' updates against a dense-matrix numpy reference, and the script on the
small synthetic dataset of the ``synth_dir`` fixture."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from bench_scripts import load_benchmark

one_pass = load_benchmark("dlrm_one_pass")
CARDS = [3, 5, 2, 7]


def _toy_split(rows: int = 40, seed: int = 0):
    """Random rows of 4 features (each id in its own table's range) and a design matrix X [rows, size] that
    writes the model as logit = X @ theta: a 1 for the bias, the dense values, a 1 per looked-up id."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(rows, 13))
    offsets = one_pass.NUM_FIXED + np.concatenate([[0], np.cumsum(CARDS)[:-1]])
    ids = np.stack([rng.integers(0, c, rows) for c in CARDS], axis=1) + offsets
    labels = (rng.uniform(size=rows) < 0.4).astype(np.float64)
    size = one_pass.NUM_FIXED + sum(CARDS)
    design = np.zeros((rows, size))
    design[:, 0], design[:, 1:one_pass.NUM_FIXED] = 1.0, dense
    np.put_along_axis(design, ids, 1.0, axis=1)
    tensors = (torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels))
    return one_pass.Split(tensors, tensors, CARDS), design, labels


def _reference(design, labels, batch_size, update):
    """One pass in batches: p = σ(Xθ), g = Xᵀ(y - p), h = (X²)ᵀ p(1-p) for every coordinate; ``update`` moves θ."""
    theta = np.zeros(design.shape[1])
    for start in range(0, len(labels) - batch_size + 1, batch_size):
        x, y = design[start:start + batch_size], labels[start:start + batch_size]
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        theta = update(theta, x.T @ (y - p), (x * x).T @ (p * (1.0 - p)))
    return theta


@pytest.mark.parametrize("batch_size", [8, 13])
def test_bayes_is_newton_per_coordinate_with_a_growing_precision(batch_size):
    data, design, labels = _toy_split()
    prior = np.random.default_rng(1).uniform(0.5, 2.0, design.shape[1])
    precision = 1.0 / prior

    def update(theta, g, h):
        precision[:] += h
        return theta + g / precision

    expected = _reference(design, labels, batch_size, update)
    got = one_pass.fit_bayes(data, batch_size, torch.from_numpy(prior.copy()))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert np.abs(expected).max() > 0.05  # it moved


@pytest.mark.parametrize("adagrad", [False, True])
def test_first_order_updates(adagrad):
    data, design, labels = _toy_split(rows=48, seed=2)
    batch_size, lr_dense, lr_sparse, eps = 12, 0.3, 2.0, 1e-8
    rate = np.full(design.shape[1], lr_sparse)
    rate[:one_pass.NUM_FIXED] = lr_dense
    state = np.zeros(design.shape[1])

    def update(theta, g, h):
        g = g / batch_size
        if not adagrad:
            return theta + rate * g
        state[:] += g * g
        return theta + rate * g / (np.sqrt(state) + eps)

    expected = _reference(design, labels, batch_size, update)
    got = one_pass.fit_first_order(data, batch_size, lr_dense, lr_sparse, adagrad=adagrad, eps=eps)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert np.abs(expected).max() > 0.05


def test_script_on_the_fixture(synth_dir, tmp_path, capsys):
    out = tmp_path / "one_pass.json"
    args = ["--data", str(synth_dir), "--batch-size", "4096", "--prior-scale", "1", "--adagrad", "0.1", "0.1",
            "--sgd", "0.1", "4", "--out", str(out)]
    assert one_pass.main(args) == 0
    result = json.loads(out.read_text())
    meta = json.loads((synth_dir / "metadata.json").read_text())
    assert result["best_auc_test"] == meta["best_auc_test"]
    assert result["train_rows"] == 102_858 and result["steps"] == 102_858 // 4096
    runs = result["runs"]
    assert [r["learner"] for r in runs] == ["bayes", "adagrad", "sgd"]
    for r in runs:
        assert r["gap"] == pytest.approx(result["best_auc_test"] - r["test_auc"])
        assert 0.6 < r["test_auc"] < result["best_auc_test"], r  # every learner learns, none beats the truth
    assert "bayes" in capsys.readouterr().out


def test_script_errors(tmp_path, synth_dir, capsys):
    with pytest.raises(SystemExit):
        one_pass.main(["--data", str(synth_dir), "--adagrad", "0.1"])  # not a pair
    with pytest.raises(SystemExit):
        one_pass.main(["--data", str(synth_dir), "--prior-scale", "0"])
    assert one_pass.main(["--data", str(tmp_path / "missing")]) == 2
    assert one_pass.main(["--data", str(synth_dir), "--batch-size", "200000"]) == 2  # no full batch
    (tmp_path / "file").write_text("")
    assert one_pass.main(["--data", str(synth_dir), "--out", str(tmp_path / "file" / "x.json")]) == 2
    plain = tmp_path / "plain"
    shutil.copytree(synth_dir, plain)
    (plain / "metadata.json").write_text((synth_dir / "metadata.json").read_text().replace('"synth"', '"other"'))
    capsys.readouterr()
    assert one_pass.main(["--data", str(plain)]) == 2  # not a synthetic dataset: no true prior
    assert "not a synthetic one" in capsys.readouterr().err
