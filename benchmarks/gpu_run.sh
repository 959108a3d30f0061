#!/usr/bin/env bash
# One device-machine command: bash benchmarks/gpu_run.sh STAGE...
# Sets up (benchmarks/gpu_setup.sh), runs each stage, and packs what it wrote under benchmarks/results/<gpu>/,
# the profiles (under $OUT/profiles, not committed) and the log into $OUT/results.tgz after every stage (a run that
# is killed keeps what it finished).
# Stages:
#   tests       the whole pytest suite on the GPU (kernels compiled, gpu-marked tests included), 8 processes (the
#               big_memory tests one at a time across them: a file lock in tests/conftest.py)
#   cudatests   the GPU tests of the CUDA C++ backends and fuselab.nn only (builds the extensions)
#   lab         fuselab env; fuselab bench square gelu_tanh --plot
#   rope | bias_act | mlp | reduce   fuselab bench OP --plot
#   graphs      fuselab bench --cuda-graph: rope, bias_act, mlp fwd+bwd and reduce (into cuda_graph/)
#   summary     benchmarks/summarize.py --write: the GPU's SUMMARY.md from the JSON files now in its folder
#   learning    benchmarks/dlrm_learning.py: the one-epoch learning sweep of the kaggle config (7-8 min; its 8M-row
#               synthetic data in /tmp/dlrm-kaggle8m)
#   profiles    fuselab profile (tables, Chrome traces, Inductor's sources) into $OUT/profiles: gelu_tanh eager and
#               torch.compile, bias_act gelu_tanh per provider, rope decode per provider, reduce dim=0
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source benchmarks/gpu_setup.sh
OUT="${OUT:-out}"; mkdir -p "$OUT"
RES="benchmarks/results/$GPU_SLUG"; mkdir -p "$RES"
PROF="$OUT/profiles"
LOG="$OUT/log.txt"
run() { echo "+ $*" | tee -a "$LOG"; local t0=$SECONDS; "$@" 2>&1 | tee -a "$LOG"; echo "  ($((SECONDS - t0)) s)" | tee -a "$LOG"; }
profile() {  # op provider dtype mode name [fuselab profile options]
  local op=$1 prov=$2 dtype=$3 mode=$4 name=$5; shift 5
  mkdir -p "$PROF"
  run fuselab profile "$op" --provider "$prov" --dtype "$dtype" --mode "$mode" "$@" \
    --trace "$PROF/${name}.trace.json" --out "$PROF/inductor_${name}" > "$PROF/${name}.txt"
}
pack() { tar czf "$OUT/results.tgz" "$RES" "$LOG" $( [ -d "$PROF" ] && echo "$PROF" ) 2>/dev/null; }
for stage in "$@"; do
  case "$stage" in
    tests) run timeout 540 python3 -m pytest -q -p no:cacheprovider --timeout 300 -n 8 -rfE tests ;;
    cudatests) run timeout 330 python3 -m pytest -q -p no:cacheprovider --timeout 300 tests/test_nn.py \
      tests/ops/test_bias_act.py tests/bench/test_suites.py -k "cuda or mlp" ;;
    lab)
      run fuselab env
      run fuselab bench square gelu_tanh --plot ;;
    rope|bias_act|mlp|reduce) run fuselab bench "$stage" --plot ;;
    graphs)
      run fuselab bench rope bias_act mlp --mode fwd+bwd --cuda-graph --plot \
        --providers eager torch.compile torchscript liger fuselab cuda
      run fuselab bench reduce --cuda-graph --plot ;;
    summary) run python3 benchmarks/summarize.py "$RES" --write ;;
    learning) run python3 benchmarks/dlrm_learning.py --data /tmp/dlrm-kaggle8m --out "$RES" ;;
    profiles)
      profile gelu_tanh eager fp32 fwd gelu_tanh_eager
      profile gelu_tanh torch.compile fp32 fwd gelu_tanh_compile
      for p in eager torch.compile fuselab cuda; do profile bias_act "$p" bf16 fwd "bias_act_gelu_tanh_$p" \
        --shape 16384x4096-gelu_tanh; done
      for p in eager torch.compile liger fuselab; do profile rope "$p" bf16 fwd "rope_decode_$p" \
        --shape decode64x1x32/8x128; done
      profile reduce fuselab bf16 fwd reduce_dim0_fuselab --shape dim=0/65536x512 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  pack
done
ls -la "$OUT"
