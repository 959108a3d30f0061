"""On a GPU: every shipped config trains 20 steps through ``fuselab dlrm train`` in every kernels x optimizer x
mode combination, on small tables, as a user runs it (a subprocess, the real CLI). A combination the CLI does not
offer ends with exit 2 and a message; none ends in a traceback.

Run the matrix with several processes (one GPU takes them): ``pytest -m gpu -n 8 tests/dlrm/test_gpu_matrix.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuselab.dlrm.config import PRESETS, load_config

pytestmark = pytest.mark.gpu

CONFIGS = tuple(sorted(PRESETS))
KERNELS = ("fuselab", "torch")
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
MODES = {"eager": [], "compile": ["--compile"], "graph": ["--cuda-graph", "--data-on-device"],
         "compiled-graph": ["--compile", "--cuda-graph", "--data-on-device"]}
#: the combinations the CLI refuses, with the words its message must hold
REFUSED = {("torch", "graph"): "mode='cuda_graph' needs kernels='fuselab'",
           ("torch", "compiled-graph"): "mode='compile_graph' needs kernels='fuselab'"}
#: learning rates given on the command line where a config has none for the optimizer (the CLI refuses the run
#: without them: test_an_optimizer_without_learning_rates_is_refused)
GIVEN_RATES = ["--lr-dense", "0.01", "--lr-sparse", "0.01"]
#: tables of a few thousand rows each: the matrix tests that every path runs, not its speed
SCALE = {"mlperf-v2": "0.0001", "mlperf-v1": "0.0001"}


def _fuselab(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "fuselab", "dlrm", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """One small synthetic set per config, made on first use in this test process."""
    made: dict[str, Path] = {}

    def get(config: str) -> Path:
        if config not in made:
            out = tmp_path_factory.mktemp(f"synth-{config}")
            scale = ["--scale", SCALE.get(config, "0.001")]
            done = _fuselab("synth", "--config", config, "--rows", "40000", *scale, "--out", str(out), "--quiet",
                            "--workers", "2", timeout=600)
            assert done.returncode == 0, done.stderr[-2000:]
            made[config] = out
        return made[config]

    return get


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_trains_through_the_cli(datasets, tmp_path, config, kernels, optimizer, mode):
    rates = [] if optimizer in load_config(config).learning_rates else GIVEN_RATES
    done = _fuselab("train", "--config", config, "--data", str(datasets(config)), "--kernels", kernels,
                    "--optimizer", optimizer, *rates, *MODES[mode], "--steps", "20", "--batch-size", "1024",
                    "--set", "eval_batches=1", "--set", "eval_batch_size=4096", "--run-dir", str(tmp_path / "run"),
                    "--quiet", timeout=900)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    refused = REFUSED.get((kernels, mode))
    if refused is not None:
        assert done.returncode == 2 and refused in done.stderr, output[-2000:]
    else:
        assert done.returncode == 0, output[-3000:]
        assert "trained 20 steps" in done.stdout, output[-2000:]


def test_an_optimizer_without_learning_rates_is_refused(datasets, tmp_path):
    """A config without learning rates for the chosen optimizer stops at once, exit 2, naming the settings to give."""
    config = next((c for c in CONFIGS if any(o not in load_config(c).learning_rates for o in OPTIMIZERS)), None)
    if config is None:
        pytest.skip("every shipped config has learning rates for every optimizer")
    optimizer = next(o for o in OPTIMIZERS if o not in load_config(config).learning_rates)
    done = _fuselab("train", "--config", config, "--data", str(datasets(config)), "--optimizer", optimizer,
                    "--steps", "1", "--run-dir", str(tmp_path / "run"), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-2000:]
    assert f"no learning rates for optimizer {optimizer!r}" in done.stderr and "lr_dense" in done.stderr


def test_a_run_that_does_not_fit_names_the_ways_out(tmp_path):
    """The full-size MLPerf DCNv2 tables at D 512 (389 GiB) fit no GPU: the memory plan is printed and the run
    stops before allocating, exit 2, naming the ways out; no traceback, no out-of-memory error."""
    data = tmp_path / "full"
    made = _fuselab("synth", "--config", "mlperf-v2", "--rows", "2000", "--out", str(data), "--quiet", timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    done = _fuselab("train", "--config", "mlperf-v2", "--data", str(data), "--steps", "1",
                    "--set", "embedding_dim=512", "--set", "bottom_mlp=[512,512]", "--run-dir", str(tmp_path / "run"),
                    timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output and "out of memory" not in output.lower(), output[-3000:]
    assert "memory plan on" in output and "does NOT fit" in output and "--set embedding_dtype=fp16" in output
