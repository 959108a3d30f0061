"""Configs (presets, files, overrides), id hashing, and facebookresearch/dlrm's Kaggle split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fuselab.core.embedding_optimizer import SGD, RowwiseAdagrad
from fuselab.dlrm.config import OPTIMIZERS, PRESETS, config_from_dict, load_config, parse_override
from fuselab.dlrm.data.loader import Hasher, kaggle_split
from fuselab.dlrm.interaction import CatConfig, DCNConfig, DotConfig
from fuselab.dlrm.layout import table_sizes


def test_presets_match_the_issue():
    k = load_config("kaggle")
    assert (k.embedding_dim, k.bottom_mlp, k.top_mlp) == (16, [512, 256, 64, 16], [512, 256, 1])
    m = load_config("mlperf-v1")
    assert (m.embedding_dim, m.bottom_mlp, m.top_mlp) == (128, [512, 256, 128], [1024, 1024, 512, 256, 1])
    assert m.max_rows_per_table == 40_000_000
    for name in PRESETS:
        assert load_config(name).name == name


def test_overrides_files_and_errors(tmp_path):
    cfg = load_config("tiny", ["lr_dense=0.5", "bottom_mlp=[16,8]", "optimizer=sgd", "bf16=true"], batch_size=64)
    got = (cfg.lr_dense, cfg.bottom_mlp, cfg.optimizer, cfg.precision, cfg.batch_size)
    assert got == (0.5, [16, 8], "sgd", "bf16", 64)
    assert parse_override("max-rows-per-table=100") == ("max_rows_per_table", 100)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "mine", "embedding_dim": 4, "bottom_mlp": [4], "top_mlp": [1]}))
    assert load_config(str(path)).embedding_dim == 4
    toml = tmp_path / "c.toml"
    toml.write_text('name = "t"\nembedding_dim = 4\nbottom_mlp = [8, 4]\ntop_mlp = [3, 1]\n')
    assert load_config(str(toml)).bottom_mlp == [8, 4]
    with pytest.raises(ValueError, match="unknown config field"):
        load_config("tiny", ["nope=1"])
    with pytest.raises(ValueError, match="bottom_mlp must end"):
        load_config("tiny", ["bottom_mlp=[8,5]"])
    with pytest.raises(ValueError, match="top_mlp"):
        load_config("tiny", ["top_mlp=[8,2]"])
    with pytest.raises(ValueError, match="interaction"):
        load_config("tiny", ["interaction=foo"])
    with pytest.raises(ValueError, match="expects"):
        load_config("tiny", ["batch_size=abc"])
    with pytest.raises(ValueError, match="config must be"):
        load_config("nonexistent")
    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.json"))


def test_cuda_graph_auto_is_on_where_it_applies(synth_dir):
    """mlperf-v2 asks for the graph with "auto": the trainer turns it on with the fused kernels on CUDA and off
    elsewhere (here, the CPU); true/false and the flag still decide; any other word is refused naming the three."""
    from fuselab.dlrm.train import RunOptions, Trainer

    assert load_config("mlperf-v2").cuda_graph == "auto" and load_config("kaggle").cuda_graph is False
    assert load_config("kaggle", ["cuda_graph=AUTO"]).cuda_graph == "auto"
    assert load_config("mlperf-v2", ["cuda_graph=false"]).cuda_graph is False
    assert load_config("mlperf-v2", cuda_graph=True).cuda_graph is True
    with pytest.raises(ValueError, match="true, false or auto"):
        load_config("kaggle", ["cuda_graph=maybe"])
    cfg = load_config("tiny", ["cuda_graph=auto", "steps=1"], device="cpu")
    trainer = Trainer(cfg, synth_dir, RunOptions(progress=False), log=lambda *a: None)
    assert trainer.cfg.cuda_graph is False and trainer.step_mode == "eager"


def test_interaction_is_a_tagged_sub_config(tmp_path):
    """The kind and its options in one entry; --set reaches an option; older spellings still read; unknown kinds
    and options are named."""
    v2 = load_config("mlperf-v2")
    assert v2.interaction == DCNConfig(layers=3, low_rank=512)
    assert v2.to_dict()["interaction"] == {"kind": "dcn", "layers": 3, "low_rank": 512}
    assert load_config("tiny").interaction == DotConfig()
    assert load_config("mlperf-v2", ["interaction.low_rank=16"]).interaction == DCNConfig(layers=3, low_rank=16)
    assert load_config("mlperf-v2", ["dcn_num_layers=2"]).interaction == DCNConfig(layers=2)  # the older name
    cfg = load_config("tiny", ["interaction={\"kind\": \"dot\", \"self_interaction\": true}"])
    assert cfg.interaction == DotConfig(self_interaction=True)
    assert load_config("tiny", interaction="cat").interaction == CatConfig()
    assert config_from_dict(v2.to_dict()) == v2
    older = {**load_config("tiny").to_dict(), "interaction": "dcn", "self_interaction": False, "dcn_num_layers": 2,
             "dcn_low_rank": 3, "embedding_layout": "fused"}  # a config of every field, saved before the tag
    assert config_from_dict(older).interaction == DCNConfig(layers=2, low_rank=3)
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"dcn_low_rank": 8, "interaction": "dcn", "embedding_dim": 4, "bottom_mlp": [4],
                                "top_mlp": [1], "embedding_layout": "per_table"}))
    assert load_config(str(path)).interaction == DCNConfig(low_rank=8)
    for override, match in (("interaction=foo", "interaction kind must be one of dot, cat, dcn, got 'foo'"),
                            ("interaction.rank=2", "interaction 'dot' has no option 'rank'; its options: "
                                                   "self_interaction"),
                            ("dcn_low_rank=2", "interaction 'dot' has no option 'low_rank'"),
                            ("interaction={\"layers\": 2}", "interaction must be a kind"),
                            ("embedding_layout=rows", "embedding_layout")):
        with pytest.raises(ValueError, match=match):
            load_config("tiny", [override])
    for override, match in (("interaction.layers=0", "interaction.layers must be a positive int, got 0"),
                            ("interaction.low_rank=1.5", "interaction.low_rank must be a positive int")):
        with pytest.raises(ValueError, match=match):
            load_config("mlperf-v2", [override])
    with pytest.raises(ValueError, match="self_interaction must be true or false"):
        load_config("tiny", ["interaction.self_interaction=yes"])
    with pytest.raises(ValueError, match="bottom_mlp must end at embedding_dim"):
        load_config("mlperf-v2", ["bottom_mlp=[8,4]"])
    assert load_config("tiny", ["bottom_mlp=[8,5]", "interaction=cat"]).bottom_mlp == [8, 5]  # cat: any width


def test_the_optimizer_is_read_once_into_its_typed_object():
    cfg = load_config("kaggle", ["adagrad_eps=1e-6"])
    assert cfg.optimizer == "rowwise_adagrad" and cfg.embedding_optimizer == RowwiseAdagrad(eps=1e-6)
    assert load_config("tiny", optimizer="sgd").embedding_optimizer == SGD()
    assert OPTIMIZERS == ("sgd", "adagrad", "rowwise_adagrad")


def test_table_sizes_from_metadata():
    meta = {"cardinalities": [10, 5_000_000_000, 0], "vocab_sizes": [3, 7, 0]}
    assert table_sizes(load_config("tiny"), meta) == [10, 5_000_000_000, 1]
    assert table_sizes(load_config("mlperf-v1"), meta) == [10, 40_000_000, 1]
    assert table_sizes(load_config("tiny", ["hashing=vocab"]), meta) == [4, 8, 1]
    with pytest.raises(ValueError, match="vocab"):
        table_sizes(load_config("tiny", ["hashing=vocab"]), {"cardinalities": [3]})


def test_modulus_hashing_int64():
    ids = torch.tensor([[0, 2**40 + 3, 7], [5, 2**62, 0xFFFFFFFF]], dtype=torch.int64)
    sizes = [3, 1000, 10]
    out = Hasher(sizes, "modulus")(ids)
    expected = torch.tensor([[0, (2**40 + 3) % 1000, 7], [2, 2**62 % 1000, 0xFFFFFFFF % 10]])
    assert torch.equal(out, expected)
    neg = Hasher([7], "modulus")(torch.tensor([[-1]]))
    assert neg.item() == 6  # 16-hex-digit ids that wrapped negative still land in range


def test_vocab_hashing_rare_ids_share_row_zero():
    vocabs = [np.array([3, 10, 2**40], dtype=np.int64), np.array([], dtype=np.int64)]
    hasher = Hasher([4, 1], "vocab", vocabs)
    ids = torch.tensor([[10, 5], [3, 0], [2**40, 9], [4, 1], [11, 2]], dtype=torch.int64)
    out = hasher(ids)
    assert out[:, 0].tolist() == [2, 1, 3, 0, 0]
    assert out[:, 1].tolist() == [0, 0, 0, 0, 0]
    capped = Hasher([2, 1], "vocab", vocabs)(ids)  # a capped table wraps vocabulary rows
    assert capped[:, 0].tolist() == [0, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="hashing"):
        Hasher([4], "bogus")


def _reference_split(n: int) -> dict[str, np.ndarray]:
    """facebookresearch/dlrm's Kaggle split, re-derived: 7 'days', extras to the first days, last day halved."""
    per_day, extras = divmod(n, 7)
    sizes = [per_day + (1 if d < extras else 0) for d in range(7)]
    offsets = np.cumsum([0, *sizes])
    days = np.array_split(np.arange(n), offsets[1:-1])
    test, val = np.array_split(days[-1], 2)
    return {"train": np.concatenate(days[:-1]), "test": test, "val": val}


@pytest.mark.parametrize("n", [7, 8, 13, 100, 45_840_617, 1_000_003])
def test_kaggle_split_matches_reference(n):
    split = kaggle_split(n)
    if n <= 1_000_003:
        ref = _reference_split(n)
        for name in ("train", "test", "val"):
            a, b = split[name]
            assert np.array_equal(np.arange(a, b), ref[name]), name
    assert split["train"][0] == 0 and split["val"][1] == n
    assert split["train"][1] == split["test"][0] and split["test"][1] == split["val"][0]
    last = n - split["train"][1]
    assert split["test"][1] - split["test"][0] == (last + 1) // 2
    with pytest.raises(ValueError):
        kaggle_split(6)
