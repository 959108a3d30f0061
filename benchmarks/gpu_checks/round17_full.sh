#!/usr/bin/env bash
# One H200 (the first GPU of the host), one call: the lab's DLRM suite on MLPerf DLRM-DCNv2 at full size (204M
# rows: fp32 tables for fuselab and stock PyTorch, TorchRec/FBGEMM's own choice), B 65536, bf16; peers from
# .peers/torchrec.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src" CUDA_VISIBLE_DEVICES=0
OUT="${OUT:-/tmp/round17}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 | tee "$OUT/device.txt"
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
PYTHONPATH="/tmp/trsite/main:$PWD/src" timeout 570 python3 -m fuselab bench dlrm --dtype bf16 \
  --case mlperf-v2-full-B=65536 --providers stock fuselab-graph fuselab-compile-graph torchrec-dmp fbgemm-tbe \
  --out "$OUT/dlrm_suite_full" > "$OUT/dlrm_suite_full.log" 2>&1
echo "suite exit $?"; grep -E "│ +│ [a-z]|mlperf|copy bandwidth|matmul rate" "$OUT/dlrm_suite_full.log" | cut -c1-130
