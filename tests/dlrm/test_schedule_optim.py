"""The learning-rate schedule, the config's new fields, and the optimizers (row-wise Adagrad vs a float64 reference)."""

from __future__ import annotations

import pytest

from fuselab.dlrm.config import DLRMConfig, load_config
from fuselab.dlrm.model import DLRM
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.schedule import LRSchedule


def test_schedule_at_key_steps():
    s = LRSchedule(lr_dense=2.0, lr_sparse=4.0, warmup_steps=4, decay_start_step=10, decay_steps=5, decay_power=2.0)
    assert [s.factor(k) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]  # linear from 0, 1 at the last warm-up step
    assert s.factor(4) == s.factor(9) == 1.0  # constant
    assert s.factor(10) == 1.0 and s.factor(11) == pytest.approx((4 / 5) ** 2) and s.factor(14) == pytest.approx(
        (1 / 5) ** 2)
    assert s.factor(15) == s.factor(1000) == 0.0  # 0 from decay_start + decay_steps on
    assert s(1) == (1.0, 2.0) and s(12) == pytest.approx((2.0 * 0.36, 4.0 * 0.36))
    flat = LRSchedule(0.1, 0.2)
    assert all(flat(k) == (0.1, 0.2) for k in (0, 1, 10**9))
    linear = LRSchedule(1.0, 1.0, decay_start_step=0, decay_steps=4, decay_power=1.0)
    assert [linear.factor(k) for k in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


@pytest.mark.parametrize("bad, match", [
    ({"warmup_steps": -1}, "warmup_steps"), ({"decay_power": 0.0}, "decay_power"),
    ({"warmup_steps": 10, "decay_start_step": 5, "decay_steps": 3}, "decay_start_step"),
    ({"lr_dense": -1.0}, "lr_dense")])
def test_schedule_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        LRSchedule(**{"lr_dense": 1.0, "lr_sparse": 1.0, **bad})
    cfg_bad = {k: v for k, v in bad.items() if k != "lr_dense"}
    if cfg_bad:
        with pytest.raises(ValueError, match=match):
            load_config("tiny", [f"{k}={v}" for k, v in cfg_bad.items()])


def test_config_fields_and_learning_rates_per_optimizer():
    tiny = load_config("tiny")
    assert (tiny.kernels, tiny.precision, tiny.cuda_graph, tiny.data_on_device) == ("auto", "fp32", False, False)
    for opt in ("sgd", "adagrad", "rowwise_adagrad"):
        cfg = load_config("tiny", optimizer=opt)
        assert [cfg.lr_dense, cfg.lr_sparse] == tiny.learning_rates[opt]
    assert load_config("tiny", ["lr_dense=0.3"], optimizer="sgd").lr_dense == 0.3  # an explicit rate wins
    kaggle = load_config("kaggle")
    assert (kaggle.optimizer, kaggle.batch_size) == ("rowwise_adagrad", 65536) and kaggle.warmup_steps > 0
    assert set(kaggle.learning_rates) == {"sgd", "adagrad", "rowwise_adagrad"}
    assert load_config("mlperf-v1").precision == "bf16"
    assert load_config("tiny", ["bf16=true"]).precision == "bf16"  # the older flag is an alias
    for bad, match in (("kernels=cuda", "kernels"), ("precision=fp16", "precision"), ("optimizer=adam", "optimizer"),
                       ("adagrad_eps=0", "adagrad_eps"), ("checkpoint_every=-1", "checkpoint_every")):
        with pytest.raises(ValueError, match=match):
            load_config("tiny", [bad])
    assert load_config("tiny", compile=True, cuda_graph=True).cuda_graph  # the compiled step in a CUDA graph
    assert DLRMConfig().to_dict()["lr_dense"] == DLRMConfig().learning_rates["adagrad"][0]


def _reference_rowwise(weight, acc, rows, grads, lr, eps):
    """float64 row-wise Adagrad: duplicate rows summed, then one update per distinct row."""
    w, a = weight.double().clone(), acc.double().clone()
    summed = {}
    for r, g in zip(rows.tolist(), grads.double()):
        summed[r] = summed.get(r, 0) + g
    for r, g in summed.items():
        a[r] += (g * g).mean()
        w[r] -= lr * g / (a[r].sqrt() + eps)
    return w, a


def test_optimizers_interface_and_state():
    model = DLRM.from_config(load_config("tiny", optimizer="rowwise_adagrad"), [7, 5, 3], kernels="torch")
    opts = Optimizers(model, lr_dense=0.1, lr_sparse=0.2)
    opts.set_lr(0.01, 0.02)
    assert opts.lr == {"dense": 0.01, "sparse": 0.02}
    state = opts.state_dict()
    assert state["optimizer"] == "rowwise_adagrad"
    sgd_model = DLRM.from_config(load_config("tiny", optimizer="sgd"), [7, 5, 3], kernels="torch")
    other = Optimizers(sgd_model, lr_dense=0.1, lr_sparse=0.2)
    with pytest.raises(ValueError, match="rowwise_adagrad"):
        other.load_state_dict(state)
