#!/usr/bin/env bash
# One GPU call: the ported ops' GPU tests (bias_act, reduce, RoPE; every backward with expanded, transposed and
# strided upstream gradients; fast launcher against the plain one) and the GEMM family's GPU tests and sweep. Full
# logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round7}"; mkdir -p "$OUT"
t() {  # log-name timeout pytest-args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rf --tb=short "$@" > "$OUT/$name.log" 2>&1
  echo "$name: $(tail -1 "$OUT/$name.log")"; grep -E "^FAILED" "$OUT/$name.log" | head -12
}
t ops_gpu 300 -n 6 -m gpu tests/ops/test_upstream_grads.py tests/ops/test_launch_seam.py tests/ops/test_bias_act.py \
  tests/ops/test_bias_act_errors.py tests/ops/test_reduce.py tests/ops/test_reduce_errors.py tests/ops/test_rope.py \
  tests/ops/test_rope_errors.py tests/test_gpu_stress.py
t gemm_gpu 360 -n 6 tests/ops/test_gemm.py tests/ops/test_gemm_fused.py tests/ops/test_gemm_layers.py \
  tests/ops/test_gemm_bench.py
OUT="$OUT" timeout 200 python3 benchmarks/gpu_checks/gemm_sweep.py > "$OUT/gemm_sweep.log" 2>&1
echo "gemm sweep exit $?"; grep -E "FAILED CHECK|cublas |fuselab|FusedLinear" "$OUT/gemm_sweep.log" | tail -40
