"""The stream bound: its kernel (under the interpreter on CPU machines), its result row and its figures."""

from __future__ import annotations

import pytest
import torch

from fuselab.bench import results as R
from fuselab.bench import stream
from fuselab.bench.options import BenchOptions
from fuselab.bench.runner import run_spec
from fuselab.bench.spec import BenchCase
from fuselab.bench.suites import get_spec
from fuselab.bench.timing import TimingJob, TimingStats
from fuselab.core.device import sm_count

from . import toy
from .test_harness import CEILINGS, FakeTimer

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the kernel runs interpreted

SMALL = (stream.Variant(256, 1, "", 2), stream.Variant(512, 2, "evict_first", 3), stream.Variant(256, 2, "", 2, 1))


def _case(nbytes: int, read: int | None, mode: str = "fwd", dtype=torch.float32) -> BenchCase:
    return BenchCase(op="toy", label="c", dtype=dtype, mode=mode, bytes=nbytes, flops=1, numel=1, read_bytes=read)


@pytest.mark.parametrize("read, write", [(1, 0), (1000, 0), (4099, 4099), (2 * 3001, 3001), (517, 5003), (9000, 70)])
@pytest.mark.parametrize("variant", SMALL, ids=lambda v: v.describe())
def test_kernel_reads_and_writes_exactly_its_elements(read, write, variant):
    """Every element read once (the partials sum to the input's sum), every output element written, none past it."""
    programs, _, step, _, _ = stream.plan(read, write, 4, variant, sm_count(DEVICE))
    src = torch.randn(read, device=DEVICE)
    dst = torch.full((write + 64,), float("nan"), device=DEVICE)  # poisoned, with a tail that must stay so
    partial = torch.full((programs,), float("nan"), device=DEVICE)
    stream.launch(src, dst, partial, read, write, variant)
    torch.testing.assert_close(partial.double().sum(), src.double().sum(), rtol=1e-5, atol=1e-4)
    offsets = torch.arange(write, device=DEVICE)
    torch.testing.assert_close(dst[:write], ((offsets % step) & 255).float(), rtol=0, atol=0)
    assert dst[write:].isnan().all(), "wrote past the end of the output"


def test_programs_share_reads_and_writes_in_proportion():
    variant = stream.Variant(4096, 4, "", 8)  # 1024 fp32 elements per step, 8 to 16 steps per program
    assert stream.plan(2 * 4096 * 10, 4096 * 10, 4, variant) == (14, 14, 1024, 6, 3)  # read 2 : write 1
    assert stream.plan(4 * 10**6, 5 * 10**6, 4, variant) == (977, 977, 1024, 4, 5)
    assert stream.plan(10**6, 10**6, 4, variant) == (245, 245, 1024, 4, 4)
    assert stream.plan(100, 10_000, 4, variant) == (1, 1, 1024, 1, 15)
    assert stream.plan(10**7, 10**4, 4, variant) == (1221, 1221, 1024, 8, 1)  # a small output: one write step
    assert stream.plan(5000, 0, 4, variant) == (1, 1, 1024, 8, 0)
    persistent = stream.Variant(4096, 4, "", 8, per_sm=2)  # 2 programs per SM, each looping over chunks
    assert stream.plan(10**6, 10**6, 4, persistent, sms=132) == (245, 245, 1024, 4, 4)
    assert stream.plan(10**7, 0, 4, persistent, sms=132) == (264, 1221, 1024, 8, 0)
    s = stream.stream(3000, 0, torch.bfloat16, DEVICE, variant)
    assert s.src.dtype == torch.bfloat16 and s.partial.numel() == 1
    with pytest.raises(ValueError, match="partial"):
        stream.launch(s.src, s.dst, s.partial[:0], 3000, 0, variant)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="read_elems"):
        stream.stream(0, 10, torch.float32, DEVICE, SMALL[0])
    with pytest.raises(ValueError, match="read_bytes"):
        _case(100, 101)
    with pytest.raises(ValueError, match="read_bytes"):
        _case(100, 0)


class VariantTimer:
    """Times each variant by its step size; runs every step once (the kernels really launch)."""

    kind = "cpu"

    def __init__(self) -> None:
        self.jobs: list[TimingJob] = []

    def measure(self, job: TimingJob) -> TimingStats:
        self.jobs.append(job)
        for step in job.steps:
            step()
        t = 1.0 if len(self.jobs) == 2 else 2.0  # the second variant is the fastest
        return TimingStats(t, t, t)


def test_measure_takes_the_fastest_variant_and_rotates_sets():
    case = _case(12_000, 8_000, dtype=torch.bfloat16)
    timer = VariantTimer()
    r = stream.measure(case, DEVICE, timer, sets=3, variants=SMALL)
    assert r.status == R.BOUND and r.provider == stream.NAME and r.median_ms == 1.0
    assert SMALL[1].describe() in r.detail
    assert [len(j.steps) for j in timer.jobs] == [3] * len(SMALL)
    assert stream.case_elements(case) == (4000, 2000)


class FailingTimer(VariantTimer):
    """Raises for the first variant (as an out-of-memory launch would), times the others."""

    def measure(self, job: TimingJob) -> TimingStats:
        self.jobs.append(job)
        if len(self.jobs) == 1:
            raise RuntimeError("CUDA out of memory\nmore lines")
        return TimingStats(1.0, 1.0, 1.0)


def test_measure_names_a_variant_that_failed_and_keeps_the_others():
    r = stream.measure(_case(12_000, 8_000), DEVICE, FailingTimer(), variants=SMALL)
    assert r.status == R.BOUND and r.median_ms == 1.0
    assert r.detail.startswith(f"best of {len(SMALL) - 1}: ")
    assert f"skipped {SMALL[0].describe()}: RuntimeError: CUDA out of memory" in r.detail
    assert "more lines" not in r.detail


def test_measure_without_a_split_is_skipped():
    r = stream.measure(_case(1000, None), DEVICE, VariantTimer(), variants=SMALL)
    assert r.status == R.SKIPPED and r.median_ms is None


def test_bound_row_gives_each_provider_its_fraction_and_never_wins():
    ok = R.Result("op", "c", "fp32", "fwd", "fuselab", 10, 1000, 0, median_ms=2.0)
    bound = R.Result("op", "c", "fp32", "fwd", stream.NAME, 10, 1000, 0, status=R.BOUND, median_ms=1.5)
    R.derive_figures([ok, bound], CEILINGS, "eager")
    assert ok.of_stream == pytest.approx(0.75)
    assert bound.gbps == pytest.approx(1000 / 1.5e-3 / 1e9) and bound.of_stream is None
    assert R.best_providers([ok, bound]) == {ok.case_key: "fuselab"}


def test_runner_adds_the_bound_on_gpus_only(monkeypatch):
    """On a CPU machine no stream row is measured; on CUDA each case with a split gets one (measure stubbed)."""
    from fuselab.bench import runner

    case = _case(toy.BYTES, toy.BYTES // 2)
    spec = toy.SPEC.__class__(**{**toy.SPEC.__dict__, "cases": lambda q: [case]})
    run = run_spec(spec, BenchOptions(write=False), torch.device("cpu"), FakeTimer(toy.TIMES_MS), CEILINGS, {})
    assert stream.NAME not in {r.provider for r in run.results}

    calls = []

    def fake_measure(c, device, timer, sets, graph):
        calls.append((c.key, sets, graph))
        return R.Result(c.op, c.label, "fp32", c.mode, stream.NAME, c.numel, c.bytes, 0, status=R.BOUND,
                        median_ms=4.0)

    monkeypatch.setattr(runner._stream, "measure", fake_measure)
    monkeypatch.setattr(runner, "_rotation_sets", lambda *a: 1)
    monkeypatch.setattr(runner, "run_case", lambda spec, c, p, *a: R.Result(
        c.op, c.label, "fp32", c.mode, p.name, c.numel, c.bytes, 0, median_ms=toy.TIMES_MS.get(p.name, 1.0)))
    cuda = torch.device("cuda")
    run = run_spec(spec, BenchOptions(write=False, cuda_graph=True), cuda, FakeTimer(toy.TIMES_MS), CEILINGS, {})
    assert calls == [(case.key, 1, True)]
    by = {r.provider: r for r in run.results}
    assert by[stream.NAME].status == R.BOUND
    assert by["eager"].of_stream == pytest.approx(4.0 / toy.TIMES_MS["eager"])
    assert not runner._wants_stream(case, cuda, BenchOptions(stream=False))
    assert not runner._wants_stream(_case(100, None), cuda, BenchOptions())


@pytest.mark.parametrize("op", ["rope", "bias_act", "reduce", "gelu_tanh", "square"])
def test_memory_bound_suites_declare_their_reads(op):
    from fuselab.bench.spec import CaseQuery

    for case in get_spec(op).cases(CaseQuery(device_type="cuda")):
        assert case.read_bytes is not None and 0 < case.read_bytes <= case.bytes, case.key
