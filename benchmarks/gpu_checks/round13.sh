#!/usr/bin/env bash
# Two GPUs, part 1 (PART=1): the overlap tests on the GPU, then the hybrid step at W = 2, eager and CUDA graph, each
# with and without the lookup on a side stream. Part 2 (PART=2): W = 1 of the same spec (the efficiency's base, and
# the one-process step with and without overlap), then the in-graph timeline at W = 2.
# Results: benchmarks/results/h100x2/ (or h200x2: the machine's name decides).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round13}"; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu" | tee "$OUT/device.txt"
case "$gpu" in *H200*) res=benchmarks/results/h200x2 ;; *) res=benchmarks/results/h100x2 ;; esac
mkdir -p "$res"
scaling() { timeout "$1" python3 benchmarks/dlrm_scaling.py --hang-s 60 --no-profile "${@:2}" 2>>"$OUT/scaling.err"; }
if [ "${PART:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/dlrm/test_step.py -k overlapped 2>&1 | tail -4 \
    | tee "$OUT/gpu_tests.txt"
  scaling 330 --nproc 2 --modes eager,cuda_graph --overlap both --limit-s 320 --out "$res" | tee "$OUT/scaling_w2.txt"
else
  scaling 300 --nproc 1 --modes eager,cuda_graph --overlap both --limit-s 290 --out "$res" | tee "$OUT/scaling_w1.txt"
  scaling 200 --nproc 2 --modes cuda_graph --overlap both --timeline --limit-s 190 --out "$OUT/timeline" \
    | tee "$OUT/timeline.txt"
fi
cp -r "$res" "$OUT/" 2>/dev/null
tail -20 "$OUT/scaling.err"
