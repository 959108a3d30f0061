#!/usr/bin/env bash
# One GPU call: the Kaggle one-id embedding update's segment kernel against the items, three alternating runs in
# one process each (the H100 machines' times drift between runs: compare within a run).
# Then the lab's DLRM suite at the Kaggle shape: stock, fuselab compiled + graph, FBGEMM's TBE.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/round12}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
for r in 1 2 3; do
  PYTHONPATH="$PWD/src" OUT= timeout 100 python3 benchmarks/gpu_checks/multihot_embedding.py --config kaggle --scale 1 \
    2>&1 | grep -v Warn | tail -6 | tee -a "$OUT/kaggle_embedding_repeats.txt"
done
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
PYTHONPATH="/tmp/trsite/main:$PWD/src" timeout 130 python3 -m fuselab bench dlrm --dtype bf16 --case kaggle-B=65536 \
  --providers stock fuselab-compile-graph fbgemm-tbe --out "$OUT/dlrm_suite" > "$OUT/dlrm_suite.log" 2>&1
echo "dlrm suite exit $?"; grep -E "│ +│ [a-z]|kaggle" "$OUT/dlrm_suite.log" | cut -c1-120
