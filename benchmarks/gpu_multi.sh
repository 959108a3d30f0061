#!/usr/bin/env bash
# One command on a machine with several GPUs: bash benchmarks/gpu_multi.sh STAGE...
# Results go to benchmarks/results/<gpu>x<N>/ and the log to $OUT/log.txt; everything is packed into
# $OUT/results.tgz after every stage. NVLink multicast stays off (fuselab sets NCCL_NVLS_ENABLE=0 itself too).
# Stages:
#   scaling     benchmarks/dlrm_scaling.py: the Kaggle step at N GPUs, then at 1, eager (DDP) and CUDA graph (each
#               world size bounded in time; a hung mode prints its stacks and ends after 60 s)
#   train       8M synthetic rows at the full Kaggle cardinalities, one epoch of `fuselab dlrm train --config kaggle
#               --cuda-graph --data-on-device --precision bf16`: one process, --nproc 1 and --nproc N
#   collectives benchmarks/collectives.py: peer copies, all_to_all and all_reduce at the DLRM's exchange sizes
#   timeline    the N-GPU graph step with each collective timed inside the graph (dlrm_scaling.py --timeline), into
#               dlrm_scaling_timeline.json
#   disttests   the distributed tests (tests/dlrm/distributed: gloo, on this machine's CPUs)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck disable=SC1091
source benchmarks/gpu_setup.sh
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
OUT="${OUT:-out}"; mkdir -p "$OUT"
RES="benchmarks/results/${GPU_SLUG}x${NGPU}"; mkdir -p "$RES"
LOG="$OUT/log.txt"
run() { echo "+ $*" | tee -a "$LOG"; local t0=$SECONDS; "$@" 2>&1 | tee -a "$LOG"; echo "  ($((SECONDS - t0)) s)" | tee -a "$LOG"; }
pack() { tar czf "$OUT/results.tgz" "$RES" "$LOG" 2>/dev/null; }
DATA=/tmp/kaggle-synth
for stage in "$@"; do
  case "$stage" in
    scaling)
      run timeout 260 python3 benchmarks/dlrm_scaling.py --nproc "$NGPU" --hang-s 60 --limit-s 200 --out "$RES"
      pack
      run timeout 200 python3 benchmarks/dlrm_scaling.py --nproc 1 --hang-s 60 --limit-s 150 --out "$RES" ;;
    train)
      [ -f "$DATA/metadata.json" ] || run fuselab dlrm synth --out "$DATA" --rows 8000000 --scale 1.0 --quiet
      common=(--config kaggle --data "$DATA" --cuda-graph --data-on-device --precision bf16 --quiet)
      run timeout 150 fuselab dlrm train "${common[@]}" --nproc "$NGPU" --run-dir /tmp/run-n \
        --json "$RES/dlrm_train_nproc${NGPU}.json"
      [ -n "${TRAIN_ALL:-}" ] && run timeout 120 fuselab dlrm train "${common[@]}" --nproc 1 --run-dir /tmp/run-n1 \
        --json "$RES/dlrm_train_nproc1.json"
      grep -A6 "^+ .*fuselab dlrm train" "$LOG" | grep -v "^  (" > "$RES/dlrm_train.txt" ;;
    collectives) run timeout 120 python3 benchmarks/collectives.py --out "$RES" ;;
    timeline)
      run timeout 120 python3 benchmarks/dlrm_scaling.py --nproc "$NGPU" --hang-s 60 --limit-s 90 --modes cuda_graph \
        --timeline --no-profile --out "$OUT/timeline"
      cp "$OUT/timeline/dlrm_scaling.json" "$RES/dlrm_scaling_timeline.json" ;;
    disttests) run timeout 400 python3 -m pytest -q -p no:cacheprovider tests/dlrm/distributed ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  pack
done
ls -la "$OUT"
