"""fuselab.testing: the per-element comparison fails on one bad element, names it, and checks NaN/inf positions."""

from __future__ import annotations

import pytest
import torch

from device_context import TestDevice
from fuselab.testing import TOLERANCES, assert_close, assert_ulp, rel_error, tolerance, tolerances, ulp


def test_one_wrong_element_fails_and_is_named():
    ref = torch.randn(5, 37, 65, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    assert_close(out, ref)
    out[2, 11, 40] += 0.25  # one element of 12025: a norm-wise check would not see it
    with pytest.raises(AssertionError, match=r"1 of 12025 elements.*index \(2, 11, 40\)"):
        assert_close(out, ref, what="y")


def test_sign_flips_fail():
    ref = torch.randn(5, 37, dtype=torch.float64)
    out = ref.clone().float()
    out[0, :3] = -out[0, :3]
    with pytest.raises(AssertionError, match="3 of 185"):
        assert_close(out, ref)


def test_nan_and_inf_positions_must_match():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    assert_close(ref.float(), ref)
    for bad in ([1.0, 0.0, float("inf"), -float("inf")], [float("nan"), float("nan"), float("inf"), -float("inf")],
                [1.0, float("nan"), -float("inf"), -float("inf")]):
        with pytest.raises(AssertionError, match="non-finite"):
            assert_close(torch.tensor(bad), ref)


def test_shape_mismatch_and_unknown_dtype():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(torch.zeros(3), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="no tolerance"):
        tolerances(torch.int32)
    with pytest.raises(TypeError, match="no tolerance"):
        tolerance(torch.int32)


def test_tensor_atol_and_overrides():
    ref = torch.tensor([0.0, 100.0], dtype=torch.float64)
    out = torch.tensor([0.5, 100.0])
    with pytest.raises(AssertionError):
        assert_close(out, ref)
    assert_close(out, ref, atol=torch.tensor([0.6, 0.0], dtype=torch.float64))
    assert_close(out, ref, atol=0.6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_ulp_bounds_rounding_and_truncation(dtype):
    ref = torch.randn(4096, dtype=torch.float64) * 3
    rounded = ref.to(dtype)
    assert_ulp(rounded, ref, 0.5)  # round to nearest: half an ulp
    # truncation toward zero: under one ulp, and more than half an ulp for some elements
    trunc = torch.where(rounded.double().abs() > ref.abs(),
                        rounded.double() - torch.sign(ref) * ulp(ref, dtype), rounded.double()).to(dtype)
    assert_ulp(trunc, ref, 1.0)
    with pytest.raises(AssertionError, match="ulp"):
        assert_ulp(trunc, ref, 0.5)


def test_ulp_values():
    assert ulp(torch.tensor([1.0]), torch.bfloat16).item() == 2.0**-7
    assert ulp(torch.tensor([3.0]), torch.float16).item() == 2.0**-9
    assert ulp(torch.tensor([0.0]), torch.float32).item() == torch.finfo(torch.float32).tiny * 2.0**-23


def test_one_rounding_table_holds_for_rounded_results():
    ref = torch.randn(10_000, dtype=torch.float64) * 10
    for dtype in TOLERANCES:
        assert_close(ref.to(dtype), ref, dtype, f"{dtype} rounded once")


def test_rel_error_kept_for_the_bench():
    ref = torch.ones(4, dtype=torch.float64)
    assert rel_error(ref.float(), ref) == 0.0
    assert rel_error(torch.zeros(3), ref) == float("inf")
    assert tolerance(torch.bfloat16) == 1e-2


def test_test_device_places_plain_factories_and_keeps_seeded_draws():
    """TestDevice: a factory call without a device lands on the context's device; one drawing from a generator
    stays on the generator's device (the same numbers as outside the context); an explicit device wins."""
    want = torch.randn(3, generator=torch.Generator().manual_seed(5))
    with TestDevice(torch.device("meta")):
        plain = torch.zeros(2)
        seeded = torch.randn(3, generator=torch.Generator().manual_seed(5))
        explicit = torch.ones(2, device="cpu")
    assert plain.device.type == "meta" and explicit.device.type == "cpu"
    assert seeded.device.type == "cpu" and torch.equal(seeded, want)
    assert torch.zeros(1).device.type == "cpu"  # the context is gone after the block
