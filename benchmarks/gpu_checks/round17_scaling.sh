#!/usr/bin/env bash
# Two GPUs, one call: MLPerf DLRM-DCNv2 at full size (204M rows, D 128, 214 ids per sample), strong scaling at a
# global batch of 65536 (W = 1: 65536 on one GPU; W = 2: 32768 per GPU), eager (DDP) and CUDA graph (the CLI's
# overlap default), tables in fp32 where they fit one GPU (H200: 105 GB) else fp16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round17}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
dtype=fp16; [ "$mem" -gt 120000 ] && dtype=fp32
echo "tables: $dtype" | tee -a "$OUT/device.txt"
timeout 560 python3 benchmarks/dlrm_scaling.py --model mlperf-v2 --global-batch 65536 --nproc 1,2 \
  --modes eager,cuda_graph --overlap auto --embedding-dtype "$dtype" --steps 10 --windows 3 --hang-s 150 \
  --limit-s 270 --out "$OUT/mp2_scaling_$dtype" 2> "$OUT/scaling.err" | tail -8
grep -E "Error|error" "$OUT/scaling.err" | tail -5 | cut -c1-300
