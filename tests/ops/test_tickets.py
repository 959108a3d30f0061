"""The ticket counters behind the single-launch split reductions (bias grad, sum/mean): the last program to
arrive sums every partial, counters are left at zero for the next launch, and the result does not depend on
which program came last."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fuselab.ops import _tickets


@triton.jit
def _group_sum_kernel(
    X,  # [groups, n_programs] values, one per program
    P,  # [groups, n_programs] partials
    OUT,  # [groups] sums
    COUNT,  # [groups] int32 ticket counters
    n_programs,
    BLOCK: tl.constexpr,
):
    group = tl.program_id(0)
    pid = tl.program_id(1)
    tl.store(P + group * n_programs + pid, tl.load(X + group * n_programs + pid) * 2.0)
    if _tickets.last_to_arrive(COUNT + group, n_programs):
        offs = tl.arange(0, BLOCK)
        parts = tl.load(P + group * n_programs + offs, mask=offs < n_programs, other=0.0, cache_modifier=".cg")
        tl.store(OUT + group, tl.sum(parts, axis=0))


@pytest.mark.parametrize("n_programs", [1, 5, 64])
def test_last_program_sums_and_resets_counters(device, n_programs):
    groups = 3
    counters = torch.zeros(groups + 2, dtype=torch.int32, device=device)  # one buffer reused by every launch
    for _ in range(3):
        x = torch.randn(groups, n_programs, device=device)
        partials = torch.full_like(x, float("nan"))
        out = torch.full((groups,), float("nan"), device=device)
        _group_sum_kernel[(groups, n_programs)](x, partials, out, counters, n_programs,
                                                BLOCK=triton.next_power_of_2(n_programs))
        torch.testing.assert_close(out.double(), 2 * x.double().sum(1), rtol=1e-5, atol=1e-5)
        assert counters.tolist() == [0] * (groups + 2)


def test_ticket_counters_are_zero_and_sized(device):
    counters = _tickets.ticket_counters(device, 3000)
    assert counters.dtype == torch.int32 and counters.numel() >= 3000
    assert int(counters.abs().sum()) == 0
    if device.type == "cuda":  # one buffer per (device, stream), reused
        assert _tickets.ticket_counters(device, 10).data_ptr() == counters.data_ptr()
