"""Every bad input to bias_act raises ValueError/TypeError naming the argument, on a first call and after good calls
planned their signatures (a repeat takes the cached path), on both backends; in place, x overlapping bias or residual
(or its own elements) is refused, and a refused call writes nothing."""

from __future__ import annotations

import pytest
import torch

import fuselab


def bad(name: str):
    """(a call that must raise, error, match)."""
    x = torch.randn(4, 8)
    if name == "x_not_tensor":
        return lambda: fuselab.bias_act([1.0, 2.0]), TypeError, r"x must be a torch\.Tensor"
    if name == "int_x":
        return lambda: fuselab.bias_act(torch.ones(4, 8, dtype=torch.int32)), TypeError, "x must have a floating"
    if name == "int_bias":
        return lambda: fuselab.bias_act(x, torch.ones(8, dtype=torch.int64)), TypeError, "bias must have a floating"
    if name == "bias_length":
        return lambda: fuselab.bias_act(x, torch.randn(7)), ValueError, r"bias must have shape \(8,\)"
    if name == "bias_rank":
        return lambda: fuselab.bias_act(x, torch.randn(1, 8)), ValueError, r"bias must have shape \(8,\)"
    if name == "residual_shape":
        return lambda: fuselab.bias_act(x, residual=torch.randn(4, 7)), ValueError, "residual must have the shape"
    if name == "activation":
        return lambda: fuselab.bias_act(x, activation="tanh"), ValueError, "activation must be one of"
    if name == "activation_unhashable":
        return lambda: fuselab.bias_act(x, activation=["relu"]), ValueError, "activation must be one of"
    if name == "alpha_tensor":
        return lambda: fuselab.bias_act(x, alpha=torch.tensor(1.0)), TypeError, "alpha must be a Python float"
    if name == "alpha_bool":  # True == 1 == 1.0 as a dict key: the signature holds alpha's type
        return lambda: fuselab.bias_act(x, alpha=True), TypeError, "alpha must be a Python float"
    if name == "zero_dim":
        return lambda: fuselab.bias_act(torch.tensor(1.0)), ValueError, "at least one dim"
    if name == "devices":
        return lambda: fuselab.bias_act(x, torch.randn(8, device="meta")), ValueError, "bias is on meta"
    if name == "inplace_leaf":
        return (lambda: fuselab.bias_act(x.clone().requires_grad_(True), inplace=True), ValueError,
                "inplace=True on x that requires grad")
    if name == "inplace_bias_requires_grad":
        return (lambda: fuselab.bias_act(x.clone(), torch.randn(8, requires_grad=True), inplace=True), ValueError,
                "bias/residual require grad")
    if name == "inplace_expanded":
        return (lambda: fuselab.bias_act(torch.randn(8).expand(4, 8), inplace=True), ValueError,
                "x is written in place but some of its elements share memory")
    raise AssertionError(name)


CASES = ["x_not_tensor", "int_x", "int_bias", "bias_length", "bias_rank", "residual_shape", "activation",
         "activation_unhashable", "alpha_tensor", "alpha_bool", "zero_dim", "devices", "inplace_leaf",
         "inplace_bias_requires_grad", "inplace_expanded"]


def _good_calls() -> None:
    """Calls with the shapes, dtypes and layouts of the bad ones, twice each (the second takes the cached path)."""
    x = torch.randn(4, 8)
    for _ in range(2):
        fuselab.bias_act(x, torch.randn(8), residual=torch.randn(4, 8), alpha=0.5)
        fuselab.bias_act(x, torch.randn(8))
        fuselab.bias_act(x)
        fuselab.bias_act(x, alpha=1)
        fuselab.bias_act(x.clone(), torch.randn(8), inplace=True)
        fuselab.bias_act(torch.randn(4, 8).requires_grad_(True), torch.randn(8), activation="gelu")
        with torch.no_grad():
            fuselab.bias_act(x.clone(), residual=torch.randn(4, 8), inplace=True)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", CASES)
def test_bad_input(request, backend, name):
    request.getfixturevalue(backend)
    fuselab.ops.clear()
    call, err, match = bad(name)
    with pytest.raises(err, match=match):
        call()


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", CASES)
def test_bad_input_after_good_calls(request, backend, name):
    """Every bad input still raises after good calls planned their signatures."""
    request.getfixturevalue(backend)
    _good_calls()
    call, err, match = bad(name)
    with pytest.raises(err, match=match):
        call()


def _same_signature(name: str):
    """(good call's arguments, a bad call's of the same signature: only values differ, so the bad one reaches the
    cached plan unless a check of values stops it, error, match). Each: (args, kwargs)."""
    buf, other, good_x = torch.randn(6, 8), torch.randn(6, 8), torch.randn(6, 8)
    bias = torch.randn(8)
    if name == "inplace_residual_is_x":
        a = torch.randn(4, 8)
        return ([torch.randn(4, 8)], {"residual": torch.randn(4, 8)}), ([a], {"residual": a}), \
            "x and residual overlap in memory"
    if name == "inplace_residual_overlapping_rows":  # rows 0-3 and 2-5 of one buffer; of two as the good call
        return ([good_x[:4]], {"residual": other[2:]}), ([buf[:4]], {"residual": buf[2:]}), \
            "x and residual overlap in memory"
    if name == "inplace_bias_is_a_row_of_x":  # the good call's bias at the same storage offset
        return ([good_x[:4]], {"bias": other[1]}), ([buf[:4]], {"bias": buf[1]}), "x and bias overlap in memory"
    if name == "inplace_leaf":  # under no_grad both calls have one signature; x requiring grad is refused anyway
        leaf = torch.randn(4, 8).requires_grad_(True)
        return ([torch.randn(4, 8)], {"bias": bias}), ([leaf], {"bias": bias}), "inplace=True on x that requires grad"
    raise AssertionError(name)


SAME_SIGNATURE = ["inplace_residual_is_x", "inplace_residual_overlapping_rows", "inplace_bias_is_a_row_of_x",
                  "inplace_leaf"]


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", SAME_SIGNATURE)
def test_bad_values_on_the_cached_path(request, backend, name):
    """An in-place call whose shapes, dtypes and layouts equal a good call's (its signature was planned) is still
    held to the checks of values: the same error as on a first call, both ways round, and x is left untouched."""
    request.getfixturevalue(backend)
    (good, good_kw), (bad_args, bad_kw), match = _same_signature(name)
    fuselab.ops.clear()
    with torch.no_grad():
        for first in (True, False):
            if not first:
                for _ in range(2):
                    fuselab.bias_act(*good, **good_kw, activation="sigmoid", inplace=True)
            before = bad_args[0].detach().clone()
            with pytest.raises(ValueError, match=match):  # a first call, then after the signature was planned
                fuselab.bias_act(*bad_args, **bad_kw, activation="sigmoid", inplace=True)
            assert torch.equal(bad_args[0].detach(), before)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
def test_inplace_on_disjoint_views_of_one_buffer(request, backend):
    """x and residual as disjoint column halves of one buffer: accepted in place, on a first call and a repeat,
    against float64; out of place, the residual may be x itself."""
    request.getfixturevalue(backend)
    for _ in range(2):
        buf, bias = torch.randn(5, 16), torch.randn(8)
        want = torch.sigmoid(buf[:, :8].double() + 0.5 * buf[:, 8:].double() + bias.double())
        out = fuselab.bias_act(buf[:, :8], bias, residual=buf[:, 8:], alpha=0.5, activation="sigmoid", inplace=True)
        fuselab.testing.assert_close(out, want, torch.float32, "in place on a column half")
        x = torch.randn(5, 8)
        fuselab.testing.assert_close(fuselab.bias_act(x, residual=x, activation="none"), 2 * x.double(),
                                     torch.float32, "residual is x, out of place")
