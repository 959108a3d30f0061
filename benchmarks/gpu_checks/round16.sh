#!/usr/bin/env bash
# Two GPUs: the CLI's --nproc efficiency with the delayed stop agreement (3000 steps at 65536 per GPU, 1 and 2
# GPUs), and one epoch at global batch 65536 on 2 GPUs (its test AUC against round15's).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round16}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/device.txt"
synth=/tmp/kaggle-synth
python3 -m fuselab dlrm synth --out $synth --rows 8000000 --scale 1.0 --quiet > /dev/null
train() {  # name, nproc, then flags
  timeout 200 python3 -m fuselab dlrm train --config kaggle --data $synth --cuda-graph --data-on-device \
    --precision bf16 --nproc "$2" --quiet "${@:3}" > "$OUT/$1.log" 2>&1
  echo "$1 exit $?: $(grep -E 'samples/s|test: AUC' "$OUT/$1.log" | tr -s ' ' | tr '\n' ' ')"
}
train steps_nproc1 1 --batch-size 65536 --steps 3000 --set eval_batches=4
train steps_nproc2 2 --batch-size 131072 --steps 3000 --set eval_batches=4
train epoch_nproc2 2 --batch-size 65536 --epochs 1
