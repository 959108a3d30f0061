#!/usr/bin/env bash
# MLPerf DLRM-DCNv2 at full size through the CLI, 60 steps each, CUDA graph: one process (the memory plan; fp32
# tables where they fit, fp16 always), then --nproc 1 and --nproc 2 (the hybrid step) with the same tables.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round17}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
dtype=fp16; [ "$mem" -gt 120000 ] && dtype=fp32
python3 -m fuselab dlrm synth --config mlperf-v2 --out /tmp/mp2 --rows 2000000 --quiet
train() {  # name, limit, then flags
  timeout "$2" python3 -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 --cuda-graph --steps 60 \
    --set eval_batches=2 --json "$OUT/cli_$1.json" "${@:3}" > "$OUT/cli_$1.log" 2>&1
  echo "$1 exit $?: $(grep -E 'total|samples/s|test: AUC|error' "$OUT/cli_$1.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"
}
[ "$dtype" = fp32 ] && train graph_fp32 120
train graph_fp16 110 --set embedding_dtype=fp16
[ -n "${WITH_NPROC1:-}" ] && train nproc1_$dtype 120 --nproc 1 --set embedding_dtype=$dtype
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && train nproc2_$dtype 190 --nproc 2 --set embedding_dtype=$dtype
