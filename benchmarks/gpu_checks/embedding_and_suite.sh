#!/usr/bin/env bash
# One GPU call: the multi-hot embedding collection against FBGEMM's TBE, the embedding GPU tests (half-precision
# tables included), the DLRM suite's GPU test (every provider, TorchRec and FBGEMM included, on a small case) and
# the MLPerf DCNv2 model through the CLI with its per-kernel table. Needs the TorchRec peers in .peers/torchrec.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/embedding_and_suite}"; mkdir -p "$OUT"
bash .peers/torchrec/unpack.sh /tmp/trsite > "$OUT/peers.txt" 2>&1 || echo "peers: unpack failed (see peers.txt)"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
py=python3
nvidia-smi --query-gpu=name --format=csv,noheader
$py benchmarks/gpu_checks/multihot_embedding.py --scale 0.01 0.1 2>&1 | tail -12
$py -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_embedding.py tests/ops/test_embedding_half.py \
  tests/ops/test_embedding_interaction_op.py 2>&1 | tail -3
timeout 300 $py -m pytest -q -p no:cacheprovider -x tests/bench/test_dlrm_suite.py -m gpu 2>&1 | tail -4
$py -m fuselab dlrm synth --config mlperf-v2 --rows 524288 --scale 0.01 --out /tmp/mp2 --quiet
timeout 300 $py -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 --steps 30 --eval-batches 2 \
  --kernels fuselab --cuda-graph --data-on-device --profile /tmp/prof --run-dir /tmp/run --json "$OUT/mp2_graph.json" \
  > "$OUT/mp2_graph.log" 2>&1; echo "mp2 graph exit $?: $(grep samples/s "$OUT/mp2_graph.log")"
cp /tmp/prof/kernels.txt "$OUT/mp2_graph_kernels.txt" 2>/dev/null
grep -E "^│ [a-z_]+_kernel|^│ nvjet" "$OUT/mp2_graph_kernels.txt" | cut -c1-40,90-160 | head -14
