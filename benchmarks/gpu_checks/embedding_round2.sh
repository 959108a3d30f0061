#!/usr/bin/env bash
# One GPU call: the item-based embedding update and the unrolled multi-hot lookup against FBGEMM's TBE (a sweep of
# the tuning knobs), the embedding GPU tests, the DLRM suite's GPU test, the MLPerf DCNv2 model through the CLI
# with its per-kernel table, and divergence in graph mode. Needs the TorchRec peers in .peers/torchrec.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/embedding_round2}"; mkdir -p "$OUT"
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
py=python3
nvidia-smi --query-gpu=name --format=csv,noheader
$py benchmarks/gpu_checks/multihot_embedding.py --scale 0.01 0.1 2>&1 | grep -v Warning | tail -20
$py -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_embedding.py tests/ops/test_embedding_half.py \
  tests/ops/test_embedding_interaction_op.py tests/dlrm/test_multi_hot.py 2>&1 | tail -2
timeout 300 $py -m pytest -q -p no:cacheprovider -x --tb=short tests/bench/test_dlrm_suite.py -m gpu 2>&1 \
  | grep -E "Error|error|assert|passed|failed" | head -12
$py -m fuselab dlrm synth --config mlperf-v2 --rows 524288 --scale 0.01 --out /tmp/mp2 --quiet
timeout 300 $py -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 --steps 30 --eval-batches 2 \
  --kernels fuselab --cuda-graph --data-on-device --profile /tmp/prof --run-dir /tmp/run --json "$OUT/mp2_graph.json" \
  > "$OUT/mp2_graph.log" 2>&1; echo "mp2 graph exit $?: $(grep samples/s "$OUT/mp2_graph.log")"
cp /tmp/prof/kernels.txt "$OUT/mp2_graph_kernels.txt" 2>/dev/null
head -24 "$OUT/mp2_graph_kernels.txt" | cut -c1-150
$py -m fuselab dlrm synth --rows 200000 --out /tmp/kg --quiet
timeout 120 $py -m fuselab dlrm train --config kaggle --data /tmp/kg --cuda-graph --data-on-device --precision bf16 \
  --steps 40 --lr-dense 1e30 --checkpoint-dir /tmp/ck --checkpoint-every 20 --run-dir /tmp/rk > "$OUT/diverge.log" 2>&1
echo "divergence exit $? (expect 3): $(tail -2 "$OUT/diverge.log" | tr '\n' ' ')"; ls /tmp/ck 2>/dev/null
