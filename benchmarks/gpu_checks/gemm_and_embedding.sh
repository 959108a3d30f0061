#!/usr/bin/env bash
# One GPU call: the GEMM family's GPU tests and its sweep against cuBLAS and cuBLASLt, then the multi-hot embedding
# knob sweep against FBGEMM (the remainder skipped for in-range ids). Needs the TorchRec peers in .peers/torchrec.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/gemm_and_embedding}"; mkdir -p "$OUT"
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_gemm.py tests/ops/test_gemm_fused.py \
  tests/ops/test_gemm_layers.py tests/ops/test_gemm_bench.py 2>&1 | tail -4
timeout 300 python3 benchmarks/gpu_checks/gemm_sweep.py --budget 200 2>&1 | tail -45
python3 benchmarks/gpu_checks/multihot_embedding.py --scale 0.01 0.1 2>&1 | grep -v Warning | tail -15
