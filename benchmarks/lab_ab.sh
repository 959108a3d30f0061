#!/usr/bin/env bash
# Lab A/B of two fuselab trees on one GPU machine:
#   bash benchmarks/lab_ab.sh OUT_DIR OLD_SRC ROUNDS OP... [-- BENCH_OPTION...]
# `fuselab bench OP... BENCH_OPTION...` (default options: --quick --providers fuselab) with PYTHONPATH=OLD_SRC and
# with PYTHONPATH=src alternately (ABBA order per pair of rounds), each run into OUT_DIR/<tree>_<round>/, then
# `fuselab bench compare` of each round's pair (OUT_DIR/compare_<round>.txt) and the figures of every case per round
# (OUT_DIR/figures.txt: fraction of the copy bandwidth, of the stream bound, samples/s). OLD_SRC: the src/ of the
# other tree (`git archive <commit> src | tar -x -C DIR`). Both trees compile their kernels in an untimed first run.
# Example, the DLRM step before and after a change:
#   bash benchmarks/lab_ab.sh /tmp/ab /tmp/old/src 2 dlrm -- --case kaggle-B=65536 --providers fuselab-graph stock
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: lab_ab.sh OUT_DIR OLD_SRC ROUNDS OP... [-- BENCH_OPTION...]" >&2; exit 2; }
dir=$1 old=$2 rounds=$3; shift 3
[ -d "$old/fuselab" ] || { echo "lab_ab.sh: OLD_SRC $old has no fuselab package" >&2; exit 2; }
ops=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do ops+=("$1"); shift; done
[ $# -gt 0 ] && shift
options=("$@"); [ ${#options[@]} -gt 0 ] || options=(--quick --providers fuselab)
mkdir -p "$dir"
bench() {  # tree out_dir
  local src=src; [ "$1" = old ] && src=$old
  # the console script's entry point (trees before the op helper have no fuselab/__main__.py)
  PYTHONPATH="$src" python3 -c "import sys; from fuselab.cli import main; sys.exit(main())" \
    bench "${ops[@]}" "${options[@]}" --out "$2" >"$2.log" 2>&1 || echo "bench $1 failed: see $2.log"
}
for tree in old new; do bench "$tree" "$dir/warm_$tree"; done
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for tree in $order; do bench "$tree" "$dir/${tree}_$r"; done
  for op in "${ops[@]}"; do
    PYTHONPATH=src python3 -m fuselab bench compare "$dir/old_$r/$op.json" "$dir/new_$r/$op.json" >>"$dir/compare_$r.txt" 2>&1
  done
done
rm -rf "$dir"/warm_*
python3 - "$dir" "$rounds" "${ops[@]}" <<'PY' | tee "$dir/figures.txt"
import json, sys
from pathlib import Path
d, rounds, ops = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def rows(tree, r, op):
    path = d / f"{tree}_{r}" / f"{op}.json"
    if not path.exists():
        return {}
    return {(x["op"], x["case"], x["dtype"], x["mode"], x["provider"]): x
            for x in json.loads(path.read_text())["results"] if x["status"] == "ok"}
print("case provider | copy fraction old/new per round | stream fraction old/new | samples/s old/new")
for op in ops:
    runs = [(rows("old", r, op), rows("new", r, op)) for r in range(1, rounds + 1)]
    for key in runs[0][0]:
        pairs = [(o.get(key), n.get(key)) for o, n in runs]
        fmt = lambda f: " ".join(f"{(a or {}).get(f) or 0:.4g}/{(b or {}).get(f) or 0:.4g}" for a, b in pairs)
        print(f"{' '.join(key)} | {fmt('copy_fraction')} | {fmt('of_stream')} | {fmt('samples_per_s')}")
PY
