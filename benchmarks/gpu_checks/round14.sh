#!/usr/bin/env bash
# Two GPUs. PART=1: the hybrid step at W = 2 and W = 1 (eager and CUDA graph, with and without overlap; small tables
# replicated), W = 2 without replicated tables, and the in-graph timeline at W = 2.
# PART=2: the same through the CLI (--nproc 1 and 2, 3000 steps each), then the one-GPU lab suite at the Kaggle
# shape with and without overlap. Results: benchmarks/results/h100x2/ (h200x2 on H200s) and $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round14}"; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu" | tee "$OUT/device.txt"
case "$gpu" in *H200*) res=benchmarks/results/h200x2 ;; *) res=benchmarks/results/h100x2 ;; esac
mkdir -p "$res"
scaling() { timeout "$1" python3 benchmarks/dlrm_scaling.py --hang-s 60 --no-profile "${@:2}" 2>>"$OUT/scaling.err"; }
if [ "${PART:-1}" = 1 ]; then
  scaling 200 --nproc 2 --modes eager,cuda_graph --overlap both --limit-s 190 --out "$res" | tail -4
  scaling 200 --nproc 1 --modes eager,cuda_graph --overlap both --limit-s 190 --out "$res" | tee "$OUT/scaling.txt"
  scaling 120 --nproc 2 --modes cuda_graph --overlap both --no-data-parallel-tables --limit-s 110 \
    --out "$OUT/sharded_only" | tee "$OUT/sharded_only.txt"
  scaling 120 --nproc 2 --modes cuda_graph --overlap both --timeline --limit-s 110 --out "$OUT/timeline" \
    | tail -3
  cp -r "$res" "$OUT/"
else
  synth=/tmp/kaggle-synth
  ( time python3 -m fuselab dlrm synth --out $synth --rows 8000000 --scale 1.0 --quiet ) 2>&1 | tail -3
  for n in 1 2; do
    timeout 200 python3 -m fuselab dlrm train --config kaggle --data $synth --cuda-graph --data-on-device \
      --precision bf16 --nproc $n --batch-size $((65536 * n)) --steps 3000 --set eval_batches=4 --quiet \
      --json "$OUT/dlrm_train_nproc$n.json" > "$OUT/dlrm_train_nproc$n.log" 2>&1
    echo "nproc $n exit $?"; tail -4 "$OUT/dlrm_train_nproc$n.log"
  done
  timeout 200 python3 -m fuselab bench dlrm --dtype bf16 --case kaggle-B=65536 --providers stock fuselab-graph \
    fuselab-graph-overlap fuselab-compile-graph fuselab-compile-graph-overlap --out "$OUT/dlrm_suite" \
    > "$OUT/dlrm_suite.log" 2>&1
  echo "dlrm suite exit $?"; grep -E "│ +│ [a-z]|kaggle" "$OUT/dlrm_suite.log" | cut -c1-130
  # the eager hybrid step at W = 2 with its kernel profile, with and without replicated tables
  for extra in "" --no-data-parallel-tables; do
    timeout 150 python3 benchmarks/dlrm_scaling.py --nproc 2 --modes eager --overlap off --hang-s 60 --limit-s 140 \
      $extra --out "$OUT/eager_profile$extra" 2>>"$OUT/scaling.err" | tail -1
  done
fi
tail -5 "$OUT/scaling.err" 2>/dev/null
