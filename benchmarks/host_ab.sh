#!/usr/bin/env bash
# Host-time A/B of two fuselab trees on one GPU machine: bash benchmarks/host_ab.sh NAME OLD_SRC ROUNDS CASE...
# Runs benchmarks/host_time.py with PYTHONPATH=OLD_SRC and with PYTHONPATH=src alternately (ABBA order per pair of
# rounds), each process pinned to one CPU core, writing $OUT/host_ab/NAME_{old,new}_<round>.json, then one --trace
# run per tree ($OUT/host_ab/NAME_{old,new}_trace.txt) and a table of the medians (NAME_table.txt).
# OLD_SRC: the src/ of the other tree, e.g. from `git archive <commit> src | tar -x -C .ab/<dir>`.
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1 old=$2 rounds=$3; shift 3
dir="${OUT:-out}/host_ab"; mkdir -p "$dir"
core=$(( $(nproc) - 1 ))
ht() {  # tree, then host_time.py's arguments
  local src=src; [ "$1" = old ] && src=$old
  PYTHONPATH="$src" taskset -c "$core" python3 benchmarks/host_time.py --cases "${cases[@]}" "${@:2}" \
    2>>"$dir/${name}_errors.txt"
}
cases=("$@")
for tree in old new; do ht "$tree" --calls 10 --warmup 5 >/dev/null; done  # compile and warm both (not timed)
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for tree in $order; do ht "$tree" --calls 2000 --json "$dir/${name}_${tree}_${r}.json" >/dev/null; done
done
for tree in old new; do ht "$tree" --trace --warmup 50 > "$dir/${name}_${tree}_trace.txt"; done
python3 - "$dir" "$name" "$rounds" <<'EOF' | tee "$dir/${name}_table.txt"
import json, statistics, sys
d, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {t: [json.load(open(f"{d}/{name}_{t}_{r}.json"))["host_us"] for r in range(1, rounds + 1)] for t in ("old", "new")}
print(f"{'case':46s} {'old: median of rounds':>22s} {'new':>8s}  per round (old/new)")
for case in runs["old"][0]:
    old = [r[case] for r in runs["old"]]; new = [r[case] for r in runs["new"]]
    pairs = " ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(old, new))
    print(f"{case:46s} {statistics.median(old):22.1f} {statistics.median(new):8.1f}  {pairs}")
EOF
