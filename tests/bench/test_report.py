"""The terminal tables fit 100 columns: every status visible, no figure cut to "…"; --wide adds the rest."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from fuselab.bench import results as R
from fuselab.bench.ceilings import Ceilings
from fuselab.bench.report import fmt_sig, fmt_time, run_table

CEIL = Ceilings(device_type="cuda", copy_gbps=3021.7, copy_bytes=2**30, copy_method="fake", copy_check_gbps=2990.1)
CASES = ("B=65536-13-512-256-64-16", "4x4096x32/32x128 interleaved")
PROVIDERS = {  # provider -> (status, detail, time in ms)
    "eager": (R.OK, "", 1.2345),
    "torch.compile": (R.OK, "", 0.81234),
    "torchscript": (R.OK, "L2-cold: 64 rotating input sets; CUDA graph replay", 1.1),
    "fuselab": (R.WRONG, "rel error 1.43e-01 > tolerance 1e-01", 0.5),
    "liger-kernel": (R.NOT_INSTALLED, "needs liger_kernel", None),
    "cuda": (R.SKIPPED, "needs CUDA", None),
    "triton-interp": (R.CORRECTNESS_ONLY, "", None),
    "apex": (R.FAILED, "timing: RuntimeError: CUDA error: an illegal memory access was encountered; compile with "
                       "TORCH_USE_CUDA_DSA to enable device-side assertions", None),
    "stream": (R.BOUND, "", 0.31),
}


def _run() -> R.OpRun:
    results = []
    for case in CASES:
        for dtype in ("bf16", "fp32"):
            for provider, (status, detail, ms) in PROVIDERS.items():
                results.append(R.Result("mlp", case, dtype, "fwd+bwd", provider, 65536 * 13, 123_456_789,
                                        987_654_321_000, status=status, detail=detail, median_ms=ms,
                                        p20_ms=None if ms is None else 0.9 * ms,
                                        p80_ms=None if ms is None else 1.1 * ms,
                                        rel_error=0.143 if status == R.WRONG else 1e-3, tolerance=0.1,
                                        peak_mem_bytes=3 * 2**30))
    R.derive_figures(results, CEIL, baseline="eager")
    return R.OpRun("mlp", "training step of the 13-512-256-64-16 relu MLP: eager vs torch.compile vs fuselab",
                   "fuselab bench mlp", {"device": "NVIDIA H100 80GB HBM3"}, CEIL,
                   "CUDA events via triton.testing.do_bench (median, p20, p80 per call)", results=results)


def _render(table, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("width", [100, 120])
def test_table_fits_and_shows_every_status(width):
    run = _run()
    text = _render(run_table(run), width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # nothing truncated: rich marks a cut cell with an ellipsis
    body = [line for line in lines if line.startswith("│")]
    for status in (R.OK, R.WRONG, R.NOT_INSTALLED, R.SKIPPED, R.FAILED, R.BOUND):
        count = sum(r.status == status for r in run.results)
        assert sum(status in line for line in body) >= count, status
    assert sum("interpreter:" in line for line in body) == sum(r.status == R.CORRECTNESS_ONLY for r in run.results)
    for r in run.results:  # each provider's name and time appear whole
        assert r.provider in text
        if r.median_ms is not None:
            assert fmt_time(r.median_ms) in text
            if r.gbps is not None:
                assert fmt_sig(r.gbps) in text


def test_wide_table_has_every_column():
    narrow, wide = _render(run_table(_run()), 250), _render(run_table(_run(), wide=True), 250)
    for column in ("p20-p80", "% stream", "TFLOP/s", "vs compile", "rel err", "peak mem"):
        assert column in wide and column not in narrow.split("\n")[2], column
    assert "--wide" in narrow
