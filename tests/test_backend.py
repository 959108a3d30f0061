"""The backend switch: FUSELAB_BACKEND read at call time, forced() restores, clear errors."""

from __future__ import annotations

import os

import pytest
import torch

from fuselab import backend


def test_default_is_auto(monkeypatch):
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    assert backend.selected_backend() == "auto"
    assert backend.use_triton(torch.device("cuda")) is True
    assert backend.use_triton("cpu") is False


def test_read_at_call_time(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "torch")
    assert backend.use_triton("cuda") is False
    monkeypatch.setenv(backend.ENV_VAR, " Triton ")  # case and spaces tolerated
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.use_triton("cpu") is True


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        backend.use_triton("cpu")
    assert backend.use_triton("cuda") is True


def test_invalid_value(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "tpu")
    with pytest.raises(ValueError, match="auto, triton, torch"):
        backend.selected_backend()


def test_forced_restores(monkeypatch):
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    with backend.forced("torch"):
        assert backend.selected_backend() == "torch"
        with backend.forced("triton"):
            assert os.environ[backend.ENV_VAR] == "triton"
        assert backend.selected_backend() == "torch"
    assert backend.ENV_VAR not in os.environ
    monkeypatch.setenv(backend.ENV_VAR, "torch")
    with pytest.raises(KeyError), backend.forced("triton"):
        raise KeyError("inside")
    assert os.environ[backend.ENV_VAR] == "torch"
    with pytest.raises(ValueError, match="backend must be one of"), backend.forced("gpu"):
        pass


def test_envinfo_slug():
    from fuselab.envinfo import device_slug

    assert device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert device_slug("NVIDIA H200") == "h200"
    assert device_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert device_slug("Tesla V100-SXM2-16GB") == "v100"
    assert device_slug("Some Odd Device") == "some-odd-device"
