#!/usr/bin/env bash
# Two GPUs, one call: through the CLI, one epoch of 8M synthetic rows at global batch 65536 on 1 and on 2 GPUs (the
# test AUC must agree), and 3000 steps at 65536 per GPU (samples/s, efficiency); then the hybrid step at W = 1, 2
# (CUDA graph, with and without overlap) and its in-graph timeline. Results: $OUT and benchmarks/results/<gpu>x2/.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round15}"; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu" | tee "$OUT/device.txt"
case "$gpu" in *H200*) res=$OUT/h200x2 ;; *) res=$OUT/h100x2 ;; esac
mkdir -p "$res"
synth=/tmp/kaggle-synth
python3 -m fuselab dlrm synth --out $synth --rows 8000000 --scale 1.0 --quiet
train() {  # name, nproc, then flags
  timeout 200 python3 -m fuselab dlrm train --config kaggle --data $synth --cuda-graph --data-on-device \
    --precision bf16 --nproc "$2" --quiet --json "$res/dlrm_train_$1.json" "${@:3}" > "$OUT/$1.log" 2>&1
  echo "$1 exit $?: $(grep -E 'samples/s|test: AUC' "$OUT/$1.log" | tr -s ' ' | tr '\n' ' ')"
}
train epoch_nproc1 1 --batch-size 65536 --epochs 1
train epoch_nproc2 2 --batch-size 65536 --epochs 1
train steps_nproc1 1 --batch-size 65536 --steps 3000 --set eval_batches=4
train steps_nproc2 2 --batch-size 131072 --steps 3000 --set eval_batches=4
scaling() { timeout "$1" python3 benchmarks/dlrm_scaling.py --hang-s 60 --no-profile "${@:2}" 2>>"$OUT/scaling.err"; }
scaling 150 --nproc 2 --modes cuda_graph --overlap both --limit-s 140 --out "$res" | tail -1
scaling 150 --nproc 1 --modes cuda_graph --overlap both --limit-s 140 --out "$res"
scaling 100 --nproc 2 --modes cuda_graph --overlap on --timeline --limit-s 90 --out "$OUT/timeline" | tail -1
cp "$OUT/timeline/dlrm_scaling.json" "$res/dlrm_scaling_timeline.json" 2>/dev/null
tail -3 "$OUT/scaling.err"
