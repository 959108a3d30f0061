#!/usr/bin/env bash
# Lab A/B of two fuselab trees on one GPU machine: bash benchmarks/lab_ab.sh OLD_SRC ROUNDS OP...
# `fuselab bench OP... --quick --providers fuselab` with PYTHONPATH=OLD_SRC and with PYTHONPATH=src alternately
# (ABBA order per pair of rounds), each run into $OUT/lab_ab/<tree>_<round>/ (<op>.json: GB/s, fraction of the copy
# bandwidth and of the stream bound, measured in that run), then `fuselab bench compare` of each round's pair
# ($OUT/lab_ab/compare_<round>.txt). OLD_SRC: the src/ of the other tree (`git archive <commit> src | tar -x -C DIR`).
# Both trees compile their kernels in an untimed first run.
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1 rounds=$2; shift 2
dir="${OUT:-out}/lab_ab"; mkdir -p "$dir"
bench() {  # tree out_dir
  local src=src; [ "$1" = old ] && src=$old
  # the console script's entry point (trees before the op helper have no fuselab/__main__.py)
  PYTHONPATH="$src" python3 -c "import sys; from fuselab.cli import main; sys.exit(main())" \
    bench "${ops[@]}" --quick --providers fuselab --out "$2" >"$2.log" 2>&1 || echo "bench $1 failed: see $2.log"
}
ops=("$@")
for tree in old new; do bench "$tree" "$dir/warm_$tree"; done
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for tree in $order; do bench "$tree" "$dir/${tree}_$r"; done
  for op in "${ops[@]}"; do
    python3 -m fuselab bench compare "$dir/old_$r/$op.json" "$dir/new_$r/$op.json" >>"$dir/compare_$r.txt" 2>&1
  done
done
rm -rf "$dir"/warm_*
# fraction of the copy bandwidth (and of the stream bound) per case, old/new per round: $dir/fractions.txt
python3 - "$dir" "$rounds" "${ops[@]}" <<'PY' | tee "$dir/fractions.txt"
import json, sys
from pathlib import Path
d, rounds, ops = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def rows(tree, r, op):
    path = d / f"{tree}_{r}" / f"{op}.json"
    if not path.exists():
        return {}
    return {(x["op"], x["case"], x["dtype"], x["mode"]): x for x in json.loads(path.read_text())["results"]
            if x["status"] == "ok"}
print("case | copy fraction old/new per round | stream fraction old/new per round")
for op in ops:
    runs = [(rows("old", r, op), rows("new", r, op)) for r in range(1, rounds + 1)]
    for key in runs[0][0]:
        pairs = [(o.get(key), n.get(key)) for o, n in runs]
        fmt = lambda f: " ".join(f"{(a or {}).get(f) or 0:.3f}/{(b or {}).get(f) or 0:.3f}" for a, b in pairs)
        print(f"{' '.join(key)} | {fmt('copy_fraction')} | {fmt('of_stream')}")
PY
