#!/usr/bin/env bash
# One GPU call: the MLPerf DCNv2 model through the CLI (multi-hot bags at D=128; tables at 1% of full size) in every
# kernels x mode combination that crashed, its per-kernel table, the embedding GPU tests, and the RoPE
# expanded-gradient check. Run from the repository root; results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/first_look}"; mkdir -p "$OUT"
py=python3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
$py benchmarks/gpu_checks/rope_expanded_grad_quick.py 2>&1 | tee "$OUT/rope_expanded.txt" | grep -c WRONG
$py -m pytest -q -x -p no:cacheprovider -n 4 tests/ops/test_embedding.py tests/dlrm/test_multi_hot.py 2>&1 | tail -3
$py -m fuselab dlrm synth --config mlperf-v2 --rows 524288 --scale 0.01 --out /tmp/mp2 --quiet
run() {  # name, then train flags
  local name=$1; shift
  /usr/bin/time -f "$name wall %e s" timeout 300 $py -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 \
    --optimizer rowwise_adagrad --steps 30 --eval-batches 2 --run-dir "/tmp/run_$name" --json "$OUT/mp2_$name.json" \
    "$@" > "$OUT/mp2_$name.log" 2>&1
  echo "$name exit $? $(grep -E 'samples/s|Traceback|Error' "$OUT/mp2_$name.log" | tail -2 | tr '\n' ' ')"
}
run fuselab_eager --kernels fuselab
run fuselab_compile --kernels fuselab --compile
run fuselab_graph --kernels fuselab --cuda-graph --data-on-device --profile "/tmp/prof_graph"
run torch_eager --kernels torch
cp /tmp/prof_graph/kernels.txt "$OUT/mp2_graph_kernels.txt" 2>/dev/null
head -40 "$OUT/mp2_graph_kernels.txt" 2>/dev/null
