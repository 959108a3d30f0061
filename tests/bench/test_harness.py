"""The harness with an injected fake timer: figures, speedups, flags, failures that do not stop a run."""

from __future__ import annotations

import math

import pytest
import torch

from fuselab.bench import results as R
from fuselab.bench.ceilings import Ceilings
from fuselab.bench.options import BenchOptions
from fuselab.bench.runner import run_spec
from fuselab.bench.timing import CudaTimer, HostTimer, TimingJob, TimingStats

from . import toy

CPU = torch.device("cpu")
CEILINGS = Ceilings(device_type="cpu", copy_gbps=100.0, copy_bytes=2**30, copy_method="fake", matmul_tflops=1.0)


class FakeTimer:
    """Returns fixed times per provider; runs each step once so the code path is exercised."""

    kind = "cpu"

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times
        self.jobs: list[TimingJob] = []

    def measure(self, job: TimingJob) -> TimingStats:
        self.jobs.append(job)
        for step in job.steps:
            step()
        t = self.times[job.provider]
        return TimingStats(t, 0.9 * t, 1.1 * t)


@pytest.fixture
def toy_run():
    timer = FakeTimer(toy.TIMES_MS)
    run = run_spec(toy.SPEC, BenchOptions(write=False), CPU, timer, CEILINGS, env={"device": "test"})
    return run, timer, {r.provider: r for r in run.results}


def test_figures_from_fake_timer(toy_run):
    _run, _, by = toy_run
    eager = by["eager"]
    assert eager.status == R.OK and eager.median_ms == 2.0
    assert eager.gbps == pytest.approx(8e6 / 2e-3 / 1e9)  # bytes / time = 4 GB/s
    assert eager.copy_fraction == pytest.approx(4.0 / 100.0)
    assert eager.tflops == pytest.approx(1e6 / 2e-3 / 1e12)
    assert (eager.p20_ms, eager.p80_ms) == pytest.approx((1.8, 2.2))
    assert eager.speedup_vs_baseline == pytest.approx(1.0)
    fast = by["fast"]
    assert fast.speedup_vs_baseline == pytest.approx(2.0)
    assert fast.speedup_vs_compile == pytest.approx(4.0)
    assert by["torch.compile"].speedup_vs_baseline == pytest.approx(0.5)
    assert eager.rel_error is not None and eager.rel_error <= eager.tolerance == 1e-5
    assert eager.timer == "cpu" and eager.peak_mem_bytes is None  # no CUDA: no peak memory


def test_wrong_provider_is_flagged_and_never_wins(toy_run):
    run, _, by = toy_run
    wrong = by["wrong"]
    assert wrong.status == R.WRONG
    assert wrong.rel_error == pytest.approx(0.1, rel=1e-3)
    assert "tolerance" in wrong.detail
    assert wrong.median_ms == 0.5  # timed, but ...
    assert wrong.speedup_vs_baseline is None and wrong.speedup_vs_compile is None  # ... never a win
    best = R.best_providers(run.results)
    assert list(best.values()) == ["fast"]


def test_failures_are_reported_and_run_goes_on(toy_run):
    _, _, by = toy_run
    assert by["boom"].status == R.FAILED and "kernel exploded" in by["boom"].detail
    assert by["boom"].detail.startswith("check:")
    assert by["broken-build"].status == R.FAILED and "cannot build" in by["broken-build"].detail
    assert by["peer"].status == R.NOT_INSTALLED and "no_such_module_fuselab_xyz" in by["peer"].detail
    assert by["gpu"].status == R.SKIPPED and by["gpu"].detail == "needs CUDA"
    for name in ("boom", "broken-build", "peer", "gpu"):
        assert by[name].median_ms is None and by[name].speedup_vs_baseline is None


def test_triton_provider_on_cpu_is_correctness_only(toy_run):
    _, timer, by = toy_run
    tri = by["tri"]
    assert tri.status == R.CORRECTNESS_ONLY
    assert tri.rel_error is not None and tri.rel_error <= 1e-5
    assert tri.median_ms is None
    assert "tri" not in [job.provider for job in timer.jobs]  # never timed
    assert toy.seen_backend and set(toy.seen_backend) == {"triton"}  # ran under forced("triton")


def test_timed_providers_got_timed(toy_run):
    _, timer, _ = toy_run
    assert sorted(j.provider for j in timer.jobs) == sorted(["eager", "fast", "torch.compile", "wrong"])


def test_provider_filter():
    timer = FakeTimer(toy.TIMES_MS)
    run = run_spec(toy.SPEC, BenchOptions(providers=("fast",), write=False), CPU, timer, CEILINGS, env={})
    assert [r.provider for r in run.results] == ["fast"]
    assert run.results[0].speedup_vs_baseline is None  # no baseline in this run


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_backward_modes_check_grads_and_time(mode):
    timer = HostTimer(warmup=1, samples=3, budget_s=0.05)
    opts = BenchOptions(providers=("eager", "wrong"), modes=(mode,), write=False)
    run = run_spec(toy.SPEC, opts, CPU, timer, CEILINGS, env={})
    by = {r.provider: r for r in run.results}
    assert by["eager"].status == R.OK and by["eager"].median_ms > 0
    assert by["wrong"].status == R.WRONG  # output and gradient both 10% off


def test_host_timer_math_with_fake_clock():
    now = [0.0]

    def step() -> None:
        now[0] += 0.002  # each call "takes" 2 ms

    timer = HostTimer(warmup=2, samples=5, min_sample_ms=1.0, budget_s=1.0, clock=lambda: now[0])
    stats = timer.measure(TimingJob(steps=[step]))
    assert stats.median_ms == pytest.approx(2.0) and stats.p20_ms == pytest.approx(2.0)
    rotated = timer.measure(TimingJob(steps=[step, step, step]))  # rotation: figures are per step
    assert rotated.median_ms == pytest.approx(2.0)


def test_host_timer_resets_grads():
    x = torch.randn(4, requires_grad=True)
    seen = []

    def step() -> None:
        seen.append(x.grad is None)
        (x * 2).sum().backward()

    HostTimer(warmup=1, samples=3, budget_s=0.01).measure(TimingJob(steps=[step], grad_to_none=[x]))
    assert all(seen)


def test_cuda_timer_resets_grads_in_every_call(monkeypatch):
    """do_bench's runtime estimate and warm-up ignore its grad_to_none: the CUDA timer's step resets the
    gradients itself, so no call accumulates (an extra kernel, and allocations that skew the estimate)."""
    import triton.testing

    x = torch.randn(4, requires_grad=True)
    seen = []

    def step() -> None:
        seen.append(x.grad is None)
        (x * 2).sum().backward()

    def fake_do_bench(fn, warmup, rep, quantiles, grad_to_none=None):
        assert grad_to_none is None
        for _ in range(7):  # estimate, warm-up and timed calls alike
            fn()
        return [2.0, 1.0, 3.0]

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    stats = CudaTimer().measure(TimingJob(steps=[step], grad_to_none=[x]))
    assert seen == [True] * 7
    assert (stats.median_ms, stats.p20_ms, stats.p80_ms) == (2.0, 1.0, 3.0)


def test_cuda_graph_results_go_to_their_own_folder(tmp_path):
    assert BenchOptions(cuda_graph=True).out_dir().name == "cuda_graph"
    assert BenchOptions(cuda_graph=True, out=tmp_path).out_dir() == tmp_path
    assert BenchOptions().out_dir().name != "cuda_graph"


def test_cuda_graph_replays_forward_and_backward():
    """The captured fwd+bwd step recomputes the same gradients, into fresh buffers, on every replay."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA graph capture needs a GPU")
    x = torch.randn(257, 33, device="cuda", requires_grad=True)
    w = torch.randn(33, device="cuda", requires_grad=True)
    g = torch.randn(257, 33, device="cuda")

    def step() -> None:
        torch.autograd.backward([torch.tanh(x * w)], [g])

    step()
    want_x, want_w = x.grad.clone(), w.grad.clone()
    replay = CudaTimer._graph(step, [x, w])
    with torch.no_grad():
        x.grad.fill_(float("nan"))  # poison: a replay must overwrite, not accumulate into, the captured buffers
        w.grad.fill_(float("nan"))
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(x.grad, want_x)
    torch.testing.assert_close(w.grad, want_w)
    stats = CudaTimer(warmup_ms=1, rep_ms=5).measure(TimingJob(steps=[step], grad_to_none=[x, w], cuda_graph=True))
    assert stats.median_ms > 0


def test_derive_figures_needs_correct_baseline():
    base = R.Result("op", "c", "fp32", "fwd", "eager", 10, 100, 0, status=R.WRONG, median_ms=1.0)
    other = R.Result("op", "c", "fp32", "fwd", "x", 10, 100, 0, median_ms=2.0)
    R.derive_figures([base, other], None, baseline="eager")
    assert other.speedup_vs_baseline is None  # a wrong baseline gives no speedups
    assert other.gbps == pytest.approx(100 / 2e-3 / 1e9) and other.copy_fraction is None
    assert other.tflops is None and not math.isnan(other.gbps)
