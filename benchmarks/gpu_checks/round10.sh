#!/usr/bin/env bash
# One GPU call: the Kaggle embedding update's kernels on the tree before the redesign (83d80b0, .ab_old/src) and on
# this one (fuselab profile), the lab's DLRM suite at the Kaggle and MLPerf DCNv2 (tables x0.1) shapes with every
# peer (TorchRec, FBGEMM's TBE from .peers/torchrec) side by side, and the GPU matrix's eager and graph runs of
# every shipped config through the CLI.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/round10}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
case=B=65536-F=26-D=16-update-rowwise_adagrad
for tree in old new; do
  src=src; [ $tree = old ] && src=.ab_old/src
  PYTHONPATH="$src" timeout 90 python3 -c "import sys; from fuselab.cli import main; sys.exit(main())" profile \
    embedding --provider fuselab --shape $case > "$OUT/embedding_profile_$tree.txt" 2>&1
  echo "== $tree"; grep -E "kernel|sort|cumsum|total|µs|us" "$OUT/embedding_profile_$tree.txt" | cut -c1-150 | head -16
done
bash .peers/torchrec/unpack.sh /tmp/trsite > "$OUT/peers.txt" 2>&1 || echo "peers: unpack failed (see peers.txt)"
PYTHONPATH="/tmp/trsite/main:$PWD/src" timeout 300 python3 -m fuselab bench dlrm --dtype bf16 \
  --case kaggle-B=65536 mlperf-v2-x0.1-B=65536 \
  --providers stock stock-adagrad fuselab-graph fuselab-compile-graph torchrec-dmp fbgemm-tbe \
  --out "$OUT/dlrm_suite" > "$OUT/dlrm_suite.log" 2>&1; echo "dlrm suite exit $?"; tail -22 "$OUT/dlrm_suite.log" | cut -c1-150
PYTHONPATH="$PWD/src" timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=line -n 12 -m gpu \
  tests/dlrm/test_gpu_matrix.py -k "not compile" > "$OUT/gpu_matrix.log" 2>&1
echo "gpu matrix (eager, graph): $(tail -1 "$OUT/gpu_matrix.log")"; grep -E "^FAILED" "$OUT/gpu_matrix.log" | head -8
