"""fuselab.profile's reusable pieces: kernel_table, render_kernel_table, fused-kernel listing, profile_case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from fuselab.profile import fused_kernels, kernel_table, profile_case, profile_fn, render_kernel_table


def test_kernel_table_cpu_ops():
    x = torch.randn(4096)

    def step() -> None:
        torch.tanh(x * 2 + 1)

    prof, wall_us = profile_fn(step, steps=4, warmup=1)
    rows = kernel_table(prof, device=False)
    names = {r.name: r for r in rows}
    assert {"aten::mul", "aten::add", "aten::tanh"} <= set(names)
    assert names["aten::tanh"].calls == 4
    assert sum(r.percent for r in rows) == pytest.approx(100.0)
    assert all(r.avg_us == pytest.approx(r.total_us / r.calls) for r in rows)
    assert rows == sorted(rows, key=lambda r: r.total_us, reverse=True)
    assert wall_us > 0
    assert kernel_table(prof) == rows  # no device events here: CPU rows by default
    console = Console(width=200, record=True)
    console.print(render_kernel_table(rows, title="t", device=False, steps=4))
    text = console.export_text()
    assert "aten::tanh" in text and "CPU time" in text


def test_fused_kernels_from_inductor_source():
    source = (
        "cpp_fused_add_mul_0 = async_compile.cpp_pybinding(['const float*'], r'''...''')\n"
        "triton_poi_fused_add_mul_pow_tanh_0 = async_compile.triton('triton_poi_fused_add_mul_pow_tanh_0', '''\n"
        "x = async_compile.wait(globals())\n"
    )
    assert fused_kernels(source) == ["cpp_fused_add_mul_0", "triton_poi_fused_add_mul_pow_tanh_0"]


def test_profile_case_errors():
    with pytest.raises(ValueError, match="valid ops"):
        profile_case("nope", "eager")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile_case("gelu_tanh", "eager", steps=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs CUDA"):
            profile_case("square", "cuda")


def test_profile_case_backward_counts_ops(tmp_path):
    res = profile_case("gelu_tanh", "eager", mode="fwd+bwd", steps=2, trace=tmp_path / "t.json")
    assert res.trace.exists() and res.launches_per_call > 8  # forward and backward ops
    assert res.case == "gelu_tanh/n=2^16/fp32/fwd+bwd" or res.device == "cuda"


def test_drop_stderr_lines_keeps_everything_else():
    """Only lines that start with the prefix go; the rest of the window's stderr (written to the descriptor or
    through ``sys.stderr``, a last line without a newline included) comes out in order, and stdout is untouched."""
    code = (
        "import os, sys\n"
        "from fuselab.profile import KINETO_NOISE, drop_stderr_lines\n"
        "sys.stderr.write('before\\n')\n"
        "with drop_stderr_lines(KINETO_NOISE):\n"
        "    os.write(2, b'USDT:2026 x.cpp:52] profiler_start\\nkept 1\\n')\n"
        "    print('out')\n"
        "    sys.stderr.write('kept 2 USDT: inside a line\\n')\n"
        "    os.write(2, b'USDT: profiler_stop\\nno newline')\n"
        "sys.stderr.write('\\nafter\\n')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "before\nkept 1\nkept 2 USDT: inside a line\nno newline\nafter\n"
    assert proc.stdout == "out\n"
