#!/usr/bin/env bash
# One GPU call: the op contract's GPU tests (every op's backward with expanded, transposed and strided upstream
# gradients; fast launcher against the plain one), the RoPE expanded-gradient diagnostic, the DLRM step's graph
# modes against eager, the DLRM suite's GPU test (TorchRec and FBGEMM included), the memory plan's refusal, and the
# MLPerf DCNv2 model through the CLI in graph and compiled-graph modes with the latter's per-kernel table.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/round6}"; mkdir -p "$OUT"
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
t() { timeout "$1" python3 -m pytest -q -p no:cacheprovider --tb=line "${@:2}" 2>&1 | grep -E "^FAILED|^/.*Error|passed|failed" | tail -8; }
t 240 -n 4 -m gpu tests/ops/test_upstream_grads.py tests/ops/test_launch_seam.py tests/test_seeded.py
python3 benchmarks/gpu_checks/rope_expanded_grad.py > "$OUT/rope_expanded_grad.txt" 2>&1; echo "rope diag exit $?"
grep -iE "fail|wrong" "$OUT/rope_expanded_grad.txt" | head -5
t 300 -n 4 -m gpu tests/dlrm/test_step.py tests/bench/test_dlrm_suite.py
t 300 -m gpu tests/dlrm/test_gpu_matrix.py -k does_not_fit
python3 -m fuselab dlrm synth --config mlperf-v2 --rows 524288 --scale 0.01 --out /tmp/mp2 --quiet
for mode in graph compiled; do
  extra=(--cuda-graph --data-on-device); [ $mode = compiled ] && extra+=(--compile --profile /tmp/prof)
  timeout 400 python3 -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 --steps 40 --eval-batches 2 \
    --kernels fuselab "${extra[@]}" --run-dir "/tmp/run_$mode" --json "$OUT/mp2_$mode.json" > "$OUT/mp2_$mode.log" 2>&1
  echo "mp2 $mode exit $?: $(grep -E 'samples/s|memory plan|total' "$OUT/mp2_$mode.log" | tr '\n' ' ')"
done
cp /tmp/prof/kernels.txt "$OUT/mp2_compiled_kernels.txt" 2>/dev/null
head -30 "$OUT/mp2_compiled_kernels.txt" | cut -c1-130
