#!/usr/bin/env bash
# One GPU call: where the redesign's A/B differences come from (ab_probe.py on the tree before it, 83d80b0 in
# .ab_old/src, and on this one), the Kaggle embedding update's knobs against FBGEMM's TBE (one id per feature, D 16,
# full-size tables), and two alternating rounds of the lab's embedding, RoPE and bias_act suites on both trees.
# Needs the TorchRec peers in .peers/torchrec and the old tree in .ab_old.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/round9}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
for tree in old new; do
  src=src; [ $tree = old ] && src=.ab_old/src
  PYTHONPATH="$src" timeout 120 python3 benchmarks/gpu_checks/ab_probe.py $tree 2>&1 | grep -v Warning
done | tee "$OUT/ab_probe.txt"
bash .peers/torchrec/unpack.sh /tmp/trsite > "$OUT/peers.txt" 2>&1 || echo "peers: unpack failed (see peers.txt)"
PYTHONPATH="/tmp/trsite/main:$PWD/src" timeout 200 python3 benchmarks/gpu_checks/multihot_embedding.py \
  --config kaggle --scale 1 > "$OUT/kaggle_embedding.txt" 2>&1; tail -10 "$OUT/kaggle_embedding.txt"
timeout 200 bash benchmarks/lab_ab.sh /tmp/ab .ab_old/src 2 embedding rope bias_act \
  -- --quick --providers fuselab > "$OUT/lab_ab.log" 2>&1
cp /tmp/ab/figures.txt "$OUT/lab_ab_figures.txt" 2>/dev/null
cat /tmp/ab/compare_*.txt > "$OUT/lab_ab_compare.txt" 2>/dev/null
cut -c1-150 "$OUT/lab_ab_figures.txt"
