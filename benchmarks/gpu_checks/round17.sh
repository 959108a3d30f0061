#!/usr/bin/env bash
# MLPerf DLRM-DCNv2 at full size (204M rows, D 128, 214 ids per sample); tables in fp32 where they fit one GPU
# (H200: 105 GB), else fp16. One part per call:
#   scaling  (two GPUs) strong scaling at a global batch of 65536 (W = 1: 65536 on one GPU; W = 2: 32768 per GPU),
#            eager (DDP) and CUDA graph with the CLI's overlap default, one launch per mode;
#   cli      through the CLI, 60 steps each, CUDA graph: one process (the memory plan; fp32 where it fits, and
#            fp16), then --nproc 2 when the host has two GPUs (WITH_NPROC1=1: --nproc 1 too);
#   suite    the lab's DLRM suite at full size on the first GPU, with the TorchRec/FBGEMM peers (.peers/torchrec).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH="$PWD/src"
OUT="${OUT:-/tmp/round17}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
dtype=fp16; [ "$mem" -gt 120000 ] && dtype=fp32
echo "tables: $dtype" | tee -a "$OUT/device.txt"
train() {  # name, limit, then flags
  timeout "$2" python3 -m fuselab dlrm train --config mlperf-v2 --data /tmp/mp2 --cuda-graph --steps 60 \
    --set eval_batches=2 --json "$OUT/cli_$1.json" "${@:3}" > "$OUT/cli_$1.log" 2>&1
  echo "$1 exit $?: $(grep -E 'total|samples/s|test: AUC|error' "$OUT/cli_$1.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"
}
case "${1:-}" in
  scaling)
    timeout 560 python3 benchmarks/dlrm_scaling.py --model mlperf-v2 --global-batch 65536 --nproc 1,2 \
      --modes eager,cuda_graph --overlap auto --embedding-dtype "$dtype" --steps 10 --windows 3 --hang-s 150 \
      --limit-s 270 --out "$OUT/mp2_scaling_$dtype" 2> "$OUT/scaling.err" | tail -8
    grep -E "Error|error" "$OUT/scaling.err" | tail -5 | cut -c1-300 ;;
  cli)
    python3 -m fuselab dlrm synth --config mlperf-v2 --out /tmp/mp2 --rows 2000000 --quiet
    [ "$dtype" = fp32 ] && train graph_fp32 120
    train graph_fp16 110 --set embedding_dtype=fp16
    [ -n "${WITH_NPROC1:-}" ] && train "nproc1_$dtype" 120 --nproc 1 --set embedding_dtype=$dtype
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && train "nproc2_$dtype" 190 --nproc 2 --set embedding_dtype=$dtype ;;
  suite)
    bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH="/tmp/trsite/main:$PWD/src" timeout 570 python3 -m fuselab bench dlrm \
      --dtype bf16 --case mlperf-v2-full-B=65536 --providers stock fuselab-graph fuselab-compile-graph \
      torchrec-dmp fbgemm-tbe --out "$OUT/dlrm_suite_full" > "$OUT/dlrm_suite_full.log" 2>&1
    echo "suite exit $?"; grep -E "│ +│ [a-z]|mlperf|copy bandwidth|matmul rate" "$OUT/dlrm_suite_full.log" | cut -c1-130 ;;
  *) echo "usage: $0 scaling|cli|suite" >&2; exit 2 ;;
esac
