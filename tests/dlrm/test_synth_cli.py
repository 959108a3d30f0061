"""``fuselab dlrm synth`` says which scale it writes: a config's full-size tables by default, a stated fraction
otherwise, and the set's size on disk before it starts."""

from __future__ import annotations

from fuselab.dlrm.cli import _synth_plan
from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES
from fuselab.dlrm.data.synth import SynthSpec


def test_a_config_is_written_at_full_size_by_default():
    cfg = load_config("mlperf-v2")
    spec = SynthSpec(rows=4_000_000, scale=1.0, cardinalities=tuple(cfg.cardinalities),
                     multi_hot_sizes=tuple(cfg.multi_hot_sizes))
    line = _synth_plan(spec, list(cfg.cardinalities), "mlperf-v2", "npy")
    assert "full-size tables" in line and "214 ids" in line
    assert "about 7.1 GB on disk" in line  # 4M rows x (52 + 214 x 8 + 8) bytes


def test_a_reduced_scale_is_stated_with_the_way_to_full_size():
    spec = SynthSpec(rows=1000, scale=1e-3)
    line = _synth_plan(spec, list(KAGGLE_CARDINALITIES), "kaggle", "npy")
    assert "tables at 0.001 of full size (33,785 rows of 33,762,577; --scale 1 for full size)" in line
    assert line.endswith("about 0 MB on disk")
    assert "on disk" not in _synth_plan(spec, list(KAGGLE_CARDINALITIES), "kaggle", "tsv")
