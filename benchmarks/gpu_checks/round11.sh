#!/usr/bin/env bash
# One GPU call: the one-id embedding update summed by the segment kernel against the items (Kaggle tables at D 16,
# then D 64 and 128 at 0.1 of their size) and FBGEMM's TBE; the embedding GPU tests; the lab's DLRM suite at the
# Kaggle shape with every peer; the GPU matrix's compiled runs and its MLPerf DCNv2 SGD runs through the CLI.
# Needs the TorchRec peers in .peers/torchrec.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/round11}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
bash .peers/torchrec/unpack.sh /tmp/trsite > "$OUT/peers.txt" 2>&1 || echo "peers: unpack failed (see peers.txt)"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
for run in "--scale 1" "--scale 0.1 --dim 64" "--scale 0.1 --dim 128"; do
  timeout 150 python3 benchmarks/gpu_checks/multihot_embedding.py --config kaggle $run 2>&1 | grep -v Warn \
    | tail -10 | tee -a "$OUT/kaggle_embedding.txt"
done
timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 -m gpu tests/ops/test_embedding.py \
  tests/ops/test_embedding_half.py > "$OUT/embedding_gpu.log" 2>&1; echo "embedding gpu: $(tail -1 "$OUT/embedding_gpu.log")"
timeout 200 python3 -m fuselab bench dlrm --dtype bf16 --case kaggle-B=65536 \
  --providers stock fuselab-graph fuselab-compile-graph torchrec-dmp fbgemm-tbe \
  --out "$OUT/dlrm_suite" > "$OUT/dlrm_suite.log" 2>&1; echo "dlrm suite exit $?"
grep -E "│ +│ [a-z]|kaggle" "$OUT/dlrm_suite.log" | cut -c1-120
PYTHONPATH="$PWD/src" timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=line -n 12 -m gpu \
  tests/dlrm/test_gpu_matrix.py -k "(compile and fuselab and rowwise) or (mlperf-v2 and sgd and not compile) or learning_rates" \
  > "$OUT/gpu_matrix.log" 2>&1
echo "gpu matrix (subset): $(tail -1 "$OUT/gpu_matrix.log")"; grep -E "^FAILED" "$OUT/gpu_matrix.log" | head -8
