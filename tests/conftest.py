"""Test set-up: Triton's interpreter on machines without CUDA, seeds, markers, backends.

``TRITON_INTERPRET=1`` must be set before triton is first imported, so it is set here,
at the top, before anything imports fuselab's kernels.
"""

from __future__ import annotations

import fcntl
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER") and not HAS_CUDA:
    # one thread per test process (and the processes tests start) when several share the cores: intra-op thread
    # pools of 2 per process on 2 cores spin against each other
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)

import pytest  # noqa: E402
from torch.overrides import _get_current_function_mode_stack  # noqa: E402

from device_context import TestDevice  # noqa: E402

#: a file that gets each test's peak reserved CUDA memory appended (to find the tests to mark ``big_memory``)
PEAK_LOG = os.environ.get("FUSELAB_TEST_PEAK_LOG")

#: device the kernel tests run on: CUDA when present, else CPU through the interpreter
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed_and_clean_state(request):
    """Seed torch; after the test, fail it if it left a torch function mode (a default-device context) behind,
    and on CUDA give its cached memory back (several test processes share one GPU), first appending its peak to
    :data:`PEAK_LOG` when that is set."""
    torch.manual_seed(0)
    if HAS_CUDA and PEAK_LOG:
        torch.cuda.reset_peak_memory_stats()
    yield
    if HAS_CUDA and PEAK_LOG and torch.cuda.is_initialized():
        with open(PEAK_LOG, "a") as log:
            log.write(f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB {request.node.nodeid}\n")
    left = _get_current_function_mode_stack()
    if left:
        while _get_current_function_mode_stack():
            torch._C._pop_torch_function_stack()
        pytest.fail(f"{request.node.nodeid} left torch function modes active: {left}")
    if HAS_CUDA and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _one_big_test_at_a_time(request, tmp_path_factory):
    """On CUDA, tests marked ``big_memory`` (GiBs each) hold an exclusive lock shared by every pytest-xdist worker of
    the run, so that several processes sharing one GPU never run two of them at once. (A file lock, not
    ``--dist loadgroup``: pytest-xdist 3.8's grouping renames node ids in a way pytest 9 ignores.)"""
    if not (HAS_CUDA and request.node.get_closest_marker("big_memory")):
        yield
        return
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above the per-worker ones
    with open(root / "big_memory.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def triton_backend(monkeypatch, request):
    """Route every op through the Triton kernels (interpreter on CPU, compiled on GPU). Tensors a test makes without
    naming a device or a generator go to :data:`DEVICE`, where the kernels run (the CPU tensors of a test written for
    the interpreter become CUDA tensors on a GPU machine); seeded draws stay on their generator's device
    (``tests/device_context.py``). A test module that places every tensor itself sets ``PLACES_ITS_TENSORS = True``
    and gets no default-device context."""
    monkeypatch.setenv("FUSELAB_BACKEND", "triton")
    if getattr(request.module, "PLACES_ITS_TENSORS", False):
        yield
        return
    with TestDevice(DEVICE):
        yield


@pytest.fixture
def torch_backend(monkeypatch):
    """Route every op through the pure-PyTorch reference path."""
    monkeypatch.setenv("FUSELAB_BACKEND", "torch")
    yield


@pytest.fixture(params=["triton", "torch"])
def backend(request) -> str:
    """Both paths of every op, one test each: :func:`triton_backend` and :func:`torch_backend`; the path's name."""
    request.getfixturevalue(f"{request.param}_backend")
    return request.param
