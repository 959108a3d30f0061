"""Every bad input to fuselab.sum/mean raises ValueError/TypeError naming the argument, on a first call and after good
calls planned their signatures (a repeat takes the cached path), on both backends. Arguments equal as dict keys
(``1 == 1.0 == True``) but refused by the checks must not reach a plan made for the accepted one."""

from __future__ import annotations

import pytest
import torch

import fuselab

OPS = {"sum": fuselab.sum, "mean": fuselab.mean}


def bad(name: str):
    """(positional arguments, keyword arguments, error, match) of a call on a (3, 4) float32 tensor unless it says."""
    x = torch.randn(3, 4)
    cases = {
        "dim_out_of_range": ((x, 2), {}, ValueError, "dim=2 is out of range"),
        "dim_in_tuple_out_of_range": ((x, (0, -3)), {}, ValueError, "dim=-3 is out of range"),
        "dim_twice": ((x, (1, -1)), {}, ValueError, "more than once"),
        "dim_float": ((x, 1.0), {}, TypeError, "dim must be None, an int or a tuple of ints"),
        "dim_bool": ((x, True), {}, TypeError, "dim must be None, an int or a tuple of ints"),
        "dim_str": ((x, "0"), {}, TypeError, "dim"),
        "dim_entry_none": ((x, (0, None)), {}, TypeError, "dim entries must be ints"),
        "dim_entry_bool": ((x, (0, True)), {}, TypeError, "dim entries must be ints"),
        "dim_entry_float": ((x, (0, 1.0)), {}, TypeError, "dim entries must be ints"),
        "int_without_dtype": ((torch.ones(3, dtype=torch.int64),), {}, TypeError, "dtype="),
        "bool_without_dtype": ((torch.ones(3, dtype=torch.bool),), {}, TypeError, "dtype="),
        "int_dtype": ((x,), {"dtype": torch.int32}, TypeError, "dtype must be one of"),
        "dtype_str": ((x,), {"dtype": "float32"}, TypeError, r"dtype must be a torch\.dtype"),
        "complex": ((torch.randn(3, dtype=torch.complex64),), {}, TypeError, "real tensor"),
        "not_tensor": (([1.0, 2.0],), {}, TypeError, r"x must be a torch\.Tensor"),
        "keepdim_int": ((x, 0), {"keepdim": 1}, TypeError, "keepdim must be a bool"),
        "keepdim_none": ((x, 0), {"keepdim": None}, TypeError, "keepdim must be a bool"),
    }
    return cases[name]


CASES = ["dim_out_of_range", "dim_in_tuple_out_of_range", "dim_twice", "dim_float", "dim_bool", "dim_str",
         "dim_entry_none", "dim_entry_bool", "dim_entry_float", "int_without_dtype", "bool_without_dtype", "int_dtype",
         "dtype_str", "complex", "not_tensor", "keepdim_int", "keepdim_none"]


def _good_calls(fn) -> None:
    """Calls that equal the bad ones as dict keys (``dim=1``, ``(0, 1)``, ``keepdim=True``/``False``, ...), twice
    each: the second takes the cached path."""
    x = torch.randn(3, 4)
    for _ in range(2):
        for dim in (None, 0, 1, (0, 1), (1, 0)):
            for keepdim in (False, True):
                fn(x, dim, keepdim)
        fn(x, dtype=torch.float32)
        fn(torch.randn(3))


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", CASES)
def test_bad_input(request, backend, op, name):
    request.getfixturevalue(backend)
    fuselab.ops.clear()
    args, kwargs, err, match = bad(name)
    with pytest.raises(err, match=match):
        OPS[op](*args, **kwargs)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", CASES)
def test_bad_input_after_good_calls(request, backend, op, name):
    """Every bad input still raises after good calls of the same tensor layout planned their signatures."""
    request.getfixturevalue(backend)
    fuselab.ops.clear()
    _good_calls(OPS[op])
    args, kwargs, err, match = bad(name)
    with pytest.raises(err, match=match):
        OPS[op](*args, **kwargs)
