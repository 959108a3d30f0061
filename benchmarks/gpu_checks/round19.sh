#!/usr/bin/env bash
# One part per call (each under the device's 600 s):
#   rope     the QKV rotation pass in place by row-block height, table and in-kernel angles, beside apply_rope;
#   mp2prof  MLPerf DCNv2 at 10% tables through the CLI with the config's defaults (fused kernels, CUDA graph), 30
#            steps, the last ones profiled: the per-kernel table of one step;
#   gemm     round18.sh gemm (the GEMM family's checks and graph timings, its GPU tests);
#   ab       the GEMM and DCN GPU tests, the GEMM family's graph time, the DCN backward's pass, then the DLRM step of
#            .ab_old/src (carried) against this tree: Kaggle and MLPerf DCNv2 at 10% tables.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round19}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
for part in "$@"; do case "$part" in
  rope) timeout 120 python3 benchmarks/gpu_checks/pass_probe.py rope 2>&1 | grep -v Warn | tee "$OUT/rope_pass.txt" ;;
  mp2prof)
    timeout 200 python3 -m fuselab dlrm synth --config mlperf-v2 --out /tmp/mp2p --rows 2200000 --scale 0.1 --quiet
    timeout 300 python3 -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2p --steps 30 --eval-batches 1 \
      --profile "$OUT/mp2_profile" --json "$OUT/mp2_profile.json" > "$OUT/mp2_profile.log" 2>&1
    echo "train exit $?"; grep -E "samples/s|rror" "$OUT/mp2_profile.log" | tail -3
    ls "$OUT/mp2_profile"; sed -n 1,200p "$OUT"/mp2_profile/kernels.txt 2>/dev/null | grep -E "^│ [A-Za-z_]" \
      | cut -c1-60,90-200 | head -40 ;;
  gemm) OUT="$OUT" bash benchmarks/gpu_checks/round18.sh gemm ;;
  ab)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -rfE tests/dlrm/distributed/test_dcn.py \
      tests/ops/test_gemm.py tests/ops/test_gemm_fused.py > "$OUT/ab_tests.log" 2>&1
    echo "tests exit $?"; grep -E "^FAILED|passed|failed" "$OUT/ab_tests.log" | tail -6 | cut -c1-200
    timeout 100 python3 benchmarks/gpu_checks/gemm_probe.py 2>&1 | grep -v Warn > "$OUT/gemm_probe.txt"
    grep -E "graph|_gemm_kernel|_pass_kernel" "$OUT/gemm_probe.txt" | cut -c1-150
    timeout 60 python3 benchmarks/gpu_checks/pass_probe.py dcn 2>&1 | grep -v Warn | tee "$OUT/dcn_pass.txt"
    timeout 260 bash benchmarks/lab_ab.sh "$OUT/dlrm_ab" .ab_old/src 1 dlrm -- --dtype bf16 \
      --case kaggle-B=65536 mlperf-v2-x0.1-B=65536 --providers fuselab-graph | tail -8 ;;
  *) echo "usage: $0 rope|mp2prof|gemm|ab ..." >&2; exit 2 ;;
esac; done
