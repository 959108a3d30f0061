"""The launch seam (:mod:`fuselab.ops._launch`): every op launches through it; its plain path (``kernel[grid]``, the
fast path's fallback) is chosen by :func:`plain_launches`, ``FUSELAB_LAUNCHER=plain`` and off CUDA;
a fast path whose private API is missing or raises gives up for plain launches with one warning; on a GPU the fast
path and the fallback give the same bits for every op."""

from __future__ import annotations

import pytest
import torch
from op_runs import OPS, contiguous, run
from toy_op import plan as toy_plan
from toy_op import validate as toy_validate

import fuselab
from fuselab.ops import _launch


@pytest.fixture
def fresh(monkeypatch):
    """Empty caches (no plan or compiled kernel of an earlier test), the probe's answer restored afterwards."""
    fuselab.ops.clear()
    monkeypatch.setattr(_launch, "_fast_ok", _launch._fast_ok)
    yield
    fuselab.ops.clear()


@pytest.mark.parametrize("name", OPS)
def test_every_op_launches_through_the_seam(triton_backend, device, fresh, name):
    """Every op's forward and backward take the seam's plain path inside plain_launches() (off CUDA they always
    do: then the counter shows the launches went through the seam), with the results of the default path."""
    want = run(name, device, contiguous)
    fuselab.ops.clear()
    before = dict(_launch.counts)
    with _launch.plain_launches():
        got = run(name, device, contiguous)
    assert _launch.counts["plain"] > before["plain"] and _launch.counts["fast"] == before["fast"], name
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), name


class _CudaLike:
    is_cuda = True


def test_launcher_switch(triton_backend, device, monkeypatch, fresh):
    """plain_launches() holds every launch inside; FUSELAB_LAUNCHER is read when a launch is first made (plain: it
    stays plain); a wrong value is an error naming it; without the private API nothing is fast."""
    monkeypatch.setattr(_launch, "_fast_ok", True)
    assert _launch.fast_path(_CudaLike()) and not _launch.fast_path(torch.zeros(1))
    with _launch.plain_launches():
        assert not _launch.fast_path(_CudaLike())
    for value, want in (("plain", "plain"), (" Plain ", "plain"), ("fast", "fast"), ("", "fast")):
        monkeypatch.setenv(_launch.ENV_VAR, value)
        assert _launch.launcher_choice() == want
    monkeypatch.setenv(_launch.ENV_VAR, "plain")
    monkeypatch.setattr(_launch, "fast_path", lambda t: _launch._fast_ok)  # as on a GPU
    launch, x, w = _toy_launch(device)
    for _ in range(2):
        y = torch.full_like(x, float("nan"))
        launch((x, w, y))
        torch.testing.assert_close(y, x * w)
    assert launch._compiled.compiled is None and _launch._fast_ok  # a plain launch, the fast path still on
    monkeypatch.setenv(_launch.ENV_VAR, "quick")
    with pytest.raises(ValueError, match="FUSELAB_LAUNCHER='quick'"):
        _toy_launch(device)[0]((x, w, torch.empty_like(x)))
    monkeypatch.setattr(_launch, "_fast_ok", False)  # the probe found no private API
    assert not _launch.fast_path(_CudaLike())


def _toy_launch(device):
    x, w = torch.randn(5, 40, device=device), torch.randn(40, device=device)
    launch = toy_plan(toy_validate(x, w, None), (x, w)).launch
    return launch, x, w


def test_missing_private_api_falls_back_to_plain(triton_backend, device, monkeypatch, fresh):
    """A compiled kernel without the attributes the fast path calls (here what the interpreter's launch returns)
    switches the fast path off with one warning; that launch and the later ones are plain and right."""
    monkeypatch.setattr(_launch, "_fast_ok", True)
    monkeypatch.setattr(_launch, "fast_path", lambda t: _launch._fast_ok)  # as on a GPU
    launch, x, w = _toy_launch(device)
    y = torch.full_like(x, float("nan"))
    with pytest.warns(RuntimeWarning, match="launch through kernel"):
        launch((x, w, y))  # the first launch: plain (it compiles), then the probe of the compiled kernel
    torch.testing.assert_close(y, x * w)
    assert _launch._fast_ok is False
    monkeypatch.setattr(_launch, "_fast_ok", True)  # even with the fast path asked for again
    plain = _launch.counts["plain"]
    y = torch.full_like(x, float("nan"))
    launch((x, w, y))
    torch.testing.assert_close(y, x * w)
    assert _launch.counts["plain"] == plain + 1


class _NoHooks:
    launch_enter_hook = launch_exit_hook = None


class _Raising:
    """A compiled kernel whose launcher rejects its arguments, as after a change of Triton's private API."""

    function = packed_metadata = None

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        raise TypeError("launcher takes 12 positional arguments")


def test_raising_private_api_falls_back_to_plain(triton_backend, device, monkeypatch, fresh):
    """A fast launch that raises TypeError launches plainly instead (once: nothing was launched), warns once and
    leaves the fast path off."""
    monkeypatch.setattr(_launch, "_fast_ok", True)
    monkeypatch.setattr(_launch, "fast_path", lambda t: _launch._fast_ok)
    monkeypatch.setattr(_launch, "_runtime_knobs", lambda: _NoHooks)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    launch, x, w = _toy_launch(device)
    launch._compiled = _launch.Compiled(launch.kernel, launch.constexprs, _Raising(), (), 0)
    plain = _launch.counts["plain"]
    y = torch.full_like(x, float("nan"))
    with pytest.warns(RuntimeWarning, match="not usable"):
        launch((x, w, y))
    torch.testing.assert_close(y, x * w)
    assert _launch._fast_ok is False and _launch.counts["plain"] == plain + 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_fast_path_equals_fallback_gpu(triton_backend, fresh, name):
    """On CUDA the fast path runs (first launches compile, repeats reuse) and gives the fallback's bits."""
    device = torch.device("cuda")
    fuselab.ops.clear()
    with _launch.plain_launches():
        want = run(name, device, contiguous)
    fast = _launch.counts["fast"]
    run(name, device, contiguous)  # plans and compiles
    got = run(name, device, contiguous)  # repeats through the compiled kernels
    assert _launch.counts["fast"] > fast, name
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), name
