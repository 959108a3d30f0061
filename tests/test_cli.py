"""The ``fuselab`` CLI on a CPU machine: bench --quick, profile, compare, env, and bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fuselab.bench.options import BenchOptions, default_out_dir
from fuselab.cli import build_parser, main, options_from_args


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


#: these tests check the no-GPU path (CPU timings, interpreter, CPU op tables); the GPU path is the lab's own run
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CLI's no-GPU path")


@cpu_only
@pytest.mark.timeout(60)
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script(_method)?` is deprecated:DeprecationWarning")  # the peer
def test_bench_quick_on_cpu(tmp_path: Path, capsys):
    code, out, _ = run_cli(["bench", "square", "gelu_tanh", "--quick", "--out", str(tmp_path), "--plot"], capsys)
    assert code == 0
    assert "CPU timings" in out and "copy bandwidth" in out
    for name in ("square.json", "square.csv", "gelu_tanh.json", "gelu_tanh.csv", "square_gbps.png",
                 "gelu_tanh_gbps.png", "gelu_tanh_roofline.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "gelu_tanh.json").read_text())
    assert data["command"].startswith("fuselab bench square gelu_tanh --quick")
    assert data["env"]["torch"] and data["ceilings"]["copy_gbps"] > 0
    by = {(r["provider"], r["mode"]): r for r in data["results"]}
    assert {p for p, _ in by} == {"eager", "torch.compile", "F.gelu", "torchscript"}
    for r in data["results"]:
        assert r["status"] == "ok", r
        assert r["median_ms"] > 0 and r["gbps"] > 0 and r["copy_fraction"] > 0 and r["timer"] == "cpu"
        assert r["rel_error"] <= r["tolerance"]
    square = json.loads((tmp_path / "square.json").read_text())
    cuda = [r for r in square["results"] if r["provider"] == "cuda"]
    assert cuda and all(r["status"] == "skipped" and r["detail"] == "needs CUDA" for r in cuda)


@cpu_only
@pytest.mark.timeout(60)
def test_profile_eager_on_cpu(tmp_path: Path, capsys):
    trace = tmp_path / "eager.json"
    code, out, _ = run_cli(["profile", "gelu_tanh", "--provider", "eager", "--trace", str(trace)], capsys)
    assert code == 0
    assert "CPU ops" in out and "aten::tanh" in out and "per call" in out
    assert json.loads(trace.read_text())["traceEvents"]
    launches = float(out.split("CPU compute ops per call:")[1].split()[0])
    assert launches >= 5  # the eager formula runs one op per operator


@pytest.mark.parametrize("op, baseline, op_name", [("square", "torch.square", "aten::square"),
                                                     ("reduce", "torch", "aten::mean")])
@pytest.mark.timeout(120)
def test_profile_defaults_to_the_ops_baseline(capsys, op, baseline, op_name):
    code, out, err = run_cli(["profile", op, "--steps", "2"], capsys)
    assert code == 0, err
    assert f" · {baseline} · 2 calls" in out and err == ""
    if not torch.cuda.is_available():
        assert op_name in out


@cpu_only
@pytest.mark.timeout(60)
def test_profile_compile_saves_inductor_source(tmp_path: Path, capsys):
    code, out, _ = run_cli(["profile", "gelu_tanh", "--provider", "torch.compile", "--out", str(tmp_path)], capsys)
    assert code == 0
    assert "Inductor fused kernels: cpp_fused" in out or "Inductor fused kernels: triton_" in out
    sources = list(tmp_path.glob("gelu_tanh_torch.compile_*_inductor_*.py"))
    assert sources and "async_compile" in sources[0].read_text()
    assert float(out.split("ops per call:")[1].split()[0]) == 1  # one compiled graph call


@pytest.mark.parametrize("argv, message", [
    (["bench", "nope"], "unknown op 'nope'; valid ops: square, gelu_tanh"),
    (["bench", "square", "--providers", "nope"], "valid providers: torch.square, mul, pow, cuda"),
    (["bench", "square", "--dtype", "fp8"], "invalid choice: 'fp8' (choose from 'fp32', 'bf16', 'fp16')"),
    (["bench", "square", "--mode", "sideways"], "invalid choice: 'sideways'"),
    (["profile", "nope"], "unknown op 'nope'"),
    (["profile", "gelu_tanh", "--provider", "nope"], "valid providers: eager, torch.compile"),
    (["profile", "gelu_tanh", "--shape", "n=3"], "unknown shape 'n=3' for gelu_tanh fp32 fwd; valid shapes: n=2^"),
    (["bench", "compare", "missing-a.json", "missing-b.json"], "not a fuselab bench result"),
])
def test_bad_arguments_exit_2_with_choices(argv, message, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def test_unwritable_out_dir(tmp_path: Path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(["bench", "square", "--quick", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "not writable" in err and "Traceback" not in err


def test_cli_defaults_match_api():
    args = build_parser().parse_args(["bench"])
    opts = options_from_args(args, ["bench"])
    defaults = BenchOptions()
    for name in ("ops", "providers", "dtypes", "modes", "quick", "out", "plot", "l2_cold", "cuda_graph", "wide"):
        assert getattr(opts, name) == getattr(defaults, name), name
    assert opts.out_dir() == default_out_dir() == Path("benchmarks/results") / default_out_dir().name


def test_providers_accept_commas():
    args = build_parser().parse_args(["bench", "square", "--providers", "mul,pow", "torch.square"])
    assert options_from_args(args, []).providers == ("mul", "pow", "torch.square")


def test_compare_command(tmp_path: Path, capsys):
    from fuselab.bench import results as R

    def run(t: float) -> R.OpRun:
        res = [R.Result("op", "c", "fp32", "fwd", "eager", 1, 8, 1, median_ms=t)]
        return R.OpRun("op", "", "", {"device": "d"}, None, "fake", results=res)

    R.save(run(1.0), tmp_path / "a")
    R.save(run(1.5), tmp_path / "b")
    a, b = str(tmp_path / "a" / "op.json"), str(tmp_path / "b" / "op.json")
    code, out, _ = run_cli(["bench", "compare", a, b], capsys)
    assert code == 0 and "regression" in out and "1 regression(s)" in out
    code, _, _ = run_cli(["bench", "compare", a, b, "--fail-on-regression"], capsys)
    assert code == 1
    code, out, _ = run_cli(["bench", "compare", a, b, "--threshold", "0.6"], capsys)
    assert "0 regression(s)" in out


def test_env_command(capsys):
    code, out, _ = run_cli(["env", "--json"], capsys)
    info = json.loads(out)
    assert code == 0 and info["torch"] and info["triton_mode"] in ("gpu", "interpreter")
    assert info["device_slug"] == default_out_dir().name


def test_dlrm_subcommand_is_wired(capsys):
    code, out, _err = run_cli(["dlrm", "--help"], capsys)
    assert code == 0 and "dlrm" in out
