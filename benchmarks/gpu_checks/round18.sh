#!/usr/bin/env bash
# One part per call (each under the device's 600 s):
#   gemm   the GEMM family under its default plans (cuBLAS backward around one pass): gemm_sweep.py's checks and
#          timings, then the gpu-marked GEMM and nn tests;
#   learn  MLPerf DCNv2 at 1% of full size, 4M synthetic rows, EPOCHS (2) epochs through the CLI with the config's
#          defaults (cuda_graph "auto": no graph flag), tables fp32, fp16, bf16, once per seed of SEEDS ("0"; e.g.
#          SEEDS="1 2 3" EPOCHS=4 to tell the dtype from the trajectory): the test AUC of each;
#   suite  the lab's DLRM suite at full size on one H200 with the TorchRec/FBGEMM peers (round17.sh suite);
#   dcn    the GPU CLI matrix (tests/dlrm/test_gpu_matrix.py);
#   ab     the pass's variants, the GEMM family's graph time, the DLRM step of .ab_old/src against this tree, GPU tests;
#   verify the fused-DCN and GEMM tests on the GPU, then the GEMM family's graph time (the pass's rotation).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round18}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
case "${1:-}" in
  gemm)
    mkdir -p "$OUT/gemm"; OUT="$OUT/gemm" timeout 240 python3 benchmarks/gpu_checks/gemm_sweep.py --budget 120 > "$OUT/gemm_sweep.log" 2>&1
    echo "sweep exit $?"; grep -E "TFLOP/s|checks|done|FAIL|rror" "$OUT/gemm_sweep.log" \
      | sed -E 's/ +/ /g' | cut -c1-110 | head -100
    timeout "${TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rfE tests/ops/test_gemm.py \
      tests/ops/test_gemm_fused.py tests/test_nn.py > "$OUT/gemm_tests.log" 2>&1
    echo "tests exit $?"; tail -4 "$OUT/gemm_tests.log" | cut -c1-200 ;;
  learn)
    python3 -m fuselab dlrm synth --config mlperf-v2 --out /tmp/mp2l --rows 4000000 --scale 0.01 --quiet
    for seed in ${SEEDS:-0}; do for dt in fp32 fp16 bf16; do
      timeout 100 python3 -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2l --set epochs=${EPOCHS:-2} \
        --set seed=$seed --set embedding_dtype=$dt --json "$OUT/learn_${dt}_$seed.json" > "$OUT/learn_${dt}_$seed.log" 2>&1
      echo "$dt seed $seed exit $?: $(grep -E 'samples/s|test: AUC|rror' "$OUT/learn_${dt}_$seed.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"
    done; done ;;
  suite) OUT="$OUT" bash benchmarks/gpu_checks/round17.sh suite ;;
  dcn)
    timeout "${TEST_S:-300}" python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rfE tests/dlrm/test_gpu_matrix.py \
      > "$OUT/gpu_matrix.log" 2>&1
    echo "matrix exit $?"; tail -6 "$OUT/gpu_matrix.log" | cut -c1-200 ;;
  ab)  # .ab_old/src: the tree before the change (git archive <commit> src | tar -x -C .ab_old), carried
    timeout 90 python3 benchmarks/gpu_checks/pass_probe.py 2>&1 | grep -E "bandwidth|bits|relu'" | tee "$OUT/pass_probe.txt"
    timeout 120 python3 benchmarks/gpu_checks/gemm_probe.py 2>&1 | grep -v Warn > "$OUT/gemm_probe.txt"
    grep -E "eager" "$OUT/gemm_probe.txt"
    timeout 330 bash benchmarks/lab_ab.sh "$OUT/dlrm_ab" .ab_old/src 1 dlrm -- --dtype bf16 \
      --case kaggle-B=65536 mlperf-v2-x0.1-B=65536 --providers fuselab-graph | tail -8
    timeout "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -n 8 -rfE tests/dlrm/distributed/test_dcn.py \
      tests/dlrm/test_model.py tests/ops/test_gemm.py tests/dlrm/test_step.py > "$OUT/ab_tests.log" 2>&1
    echo "tests exit $?"; tail -4 "$OUT/ab_tests.log" | cut -c1-200 ;;
  verify)  # what the stop that wrote the pass's direct rotation could not run: its GPU tests and its time
    timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 -rfE tests/dlrm/distributed/test_dcn.py \
      tests/ops/test_gemm.py tests/ops/test_gemm_fused.py > "$OUT/verify_tests.log" 2>&1
    echo "tests exit $?"; tail -3 "$OUT/verify_tests.log" | cut -c1-200
    timeout 120 python3 benchmarks/gpu_checks/gemm_probe.py 2>&1 | grep -v Warn > "$OUT/gemm_probe.txt"
    grep -E "eager|_pass_kernel" "$OUT/gemm_probe.txt" ;;
  *) echo "usage: $0 gemm|learn|suite|dcn|ab|verify" >&2; exit 2 ;;
esac
