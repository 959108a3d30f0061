"""Shared fixtures of the DLRM tests: one intra-op thread (small ops; 2 contended cores), small datasets."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    """A small synthetic npy dataset (seeded), shared by the tests that only read it."""
    from fuselab.dlrm.data.synth import SynthSpec, write_synthetic

    root = tmp_path_factory.mktemp("synth")
    write_synthetic(root, SynthSpec(rows=120_000, scale=2e-4, seed=1), shard_rows=50_000, workers=1)
    return root
