#!/usr/bin/env bash
# One GPU call: the op contract's GPU tests (every op), then the A/B of issue 37's redesign against the tree before it
# (83d80b0, its src/ carried in .ab_old/src): the lab's op suites (--quick, fuselab provider, alternating) and the
# Kaggle DLRM step through the CLI (CUDA graph, bf16, data on the device), each tree on the same data.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/round8}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
PYTHONPATH="$PWD/src" timeout 330 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 6 -m gpu \
  tests/ops/test_upstream_grads.py tests/ops/test_launch_seam.py tests/ops/test_embedding.py \
  tests/ops/test_embedding_half.py tests/ops/test_embedding_errors.py tests/ops/test_interaction.py \
  tests/ops/test_interaction_errors.py tests/ops/test_embedding_interaction_op.py tests/dlrm/test_step.py \
  > "$OUT/ops_gpu.log" 2>&1
echo "ops gpu: $(tail -1 "$OUT/ops_gpu.log")"; grep -E "^FAILED" "$OUT/ops_gpu.log" | head -10
timeout 240 bash benchmarks/lab_ab.sh /tmp/ab .ab_old/src 1 rope bias_act reduce interaction embedding \
  -- --quick --providers fuselab > "$OUT/lab_ab.log" 2>&1
cp /tmp/ab/figures.txt "$OUT/lab_ab_figures.txt" 2>/dev/null; cat /tmp/ab/compare_1.txt > "$OUT/lab_ab_compare.txt" 2>/dev/null
tail -25 "$OUT/lab_ab_figures.txt" 2>/dev/null | cut -c1-140
PYTHONPATH="$PWD/src" python3 -m fuselab dlrm synth --rows 1048576 --scale 1 --out /tmp/kg --quiet > /dev/null
for tree in old new; do
  src=src; [ $tree = old ] && src=.ab_old/src
  PYTHONPATH="$src" timeout 150 python3 -c "import sys; from fuselab.cli import main; sys.exit(main())" dlrm train \
    --config kaggle --data /tmp/kg --cuda-graph --data-on-device --precision bf16 --steps 400 --eval-batches 1 \
    --run-dir "/tmp/run_$tree" --json "$OUT/kaggle_$tree.json" > "$OUT/kaggle_$tree.log" 2>&1
  echo "kaggle $tree exit $?: $(grep samples/s "$OUT/kaggle_$tree.log")"
done
