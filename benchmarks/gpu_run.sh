#!/usr/bin/env bash
# One device-machine command: bash benchmarks/gpu_run.sh STAGE...
# Sets up (benchmarks/gpu_setup.sh), runs each stage, and packs every result file written under
# benchmarks/results/<gpu>/ plus the logs into $OUT/results.tgz (the device tool brings back few files).
# Stages:
#   tests       the whole pytest suite on the GPU (kernels compiled, gpu-marked tests included)
#   cudatests   the GPU tests of the CUDA C++ backends and fuselab.nn only (builds the extensions)
#   lab         fuselab env; fuselab bench square gelu_tanh --plot; fuselab profile gelu_tanh (eager, compile)
#   rope | bias_act | mlp | reduce   fuselab bench OP --plot
#   fwdbwd      exploration: rope and bias_act forward+backward only (into explore/)
#   sweep       benchmarks/sweeps/reduce_sweep.py (the reduction planner's knobs)
#   splitprobe  benchmarks/sweeps/reduce_split_probe.py (split order, column tiles; into probes/)
#   graphs      fuselab bench --cuda-graph: rope, bias_act, mlp fwd+bwd and reduce (into cuda_graph/)
#   mlpgraph    fuselab bench mlp --cuda-graph only (into cuda_graph/)
#   bagraph     fuselab bench bias_act --mode fwd+bwd --cuda-graph only (into cuda_graph/)
#   ropetiles   benchmarks/sweeps/rope_tiles.py (RoPE tile/warps vs a copy of the same bytes, into probes/)
#   host        host time per call: RoPE decode by provider, fuselab's eager paths, the bias_act step's launch
#               windows, the MLP step (benchmarks/sweeps/*.py, into probes/ and host_overhead.txt)
#   profiles    fuselab profile: bias_act gelu_tanh (eager, torch.compile, fuselab, cuda), rope decode, reduce dim=0
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source benchmarks/gpu_setup.sh
OUT="${OUT:-out}"; mkdir -p "$OUT"
RES="benchmarks/results/$GPU_SLUG"; mkdir -p "$RES"
LOG="$OUT/log.txt"
run() { echo "+ $*" | tee -a "$LOG"; local t0=$SECONDS; "$@" 2>&1 | tee -a "$LOG"; echo "  ($((SECONDS - t0)) s)" | tee -a "$LOG"; }
profile() {  # op provider dtype mode name [shape]
  local op=$1 prov=$2 dtype=$3 mode=$4 name=$5; shift 5
  run fuselab profile "$op" --provider "$prov" --dtype "$dtype" --mode "$mode" "$@" \
    --trace "$RES/profile_${name}.trace.json" --out "$RES/inductor_${name}" > "$RES/profile_${name}.txt"
}
pack() { tar czf "$OUT/results.tgz" "$RES" "$LOG" 2>/dev/null; }  # after every stage: a killed run keeps its results
for stage in "$@"; do
  case "$stage" in
    tests) run timeout 480 python3 -m pytest -q -p no:cacheprovider --timeout 300 tests ;;
    cudatests) run timeout 330 python3 -m pytest -q -p no:cacheprovider --timeout 300 tests/test_nn.py \
      tests/ops/test_bias_act.py tests/bench/test_suites.py -k "cuda or mlp" ;;
    lab)
      run fuselab env
      run fuselab bench square gelu_tanh --plot
      profile gelu_tanh eager fp32 fwd gelu_tanh_eager
      profile gelu_tanh torch.compile fp32 fwd gelu_tanh_compile ;;
    rope|bias_act|mlp|reduce) run fuselab bench "$stage" --plot ;;
    fwdbwd)  # exploration: forward+backward only, into explore/ (not the committed tables)
      run fuselab bench rope bias_act --mode fwd+bwd --providers eager torch.compile liger fuselab cuda \
        --out "$RES/explore"
      profile bias_act fuselab bf16 fwd+bwd bias_act_relu_fwdbwd_fuselab --shape 16384x4096-relu ;;
    graphs)
      run fuselab bench rope bias_act mlp --mode fwd+bwd --cuda-graph --plot \
        --providers eager torch.compile torchscript liger fuselab cuda
      run fuselab bench reduce --cuda-graph --plot ;;
    mlpgraph) run fuselab bench mlp --mode fwd+bwd --cuda-graph --plot ;;
    bagraph) run fuselab bench bias_act --mode fwd+bwd --cuda-graph --plot \
      --providers eager torch.compile torchscript fuselab cuda ;;
    ropetiles) run python3 benchmarks/sweeps/rope_tiles.py > "$RES/probes/rope_tiles.txt" ;;
    host)
      mkdir -p "$RES/probes"
      run python3 benchmarks/sweeps/decode_host.py > "$RES/probes/decode_host.txt"
      run python3 benchmarks/sweeps/host_overhead.py > "$RES/host_overhead.txt"
      run python3 benchmarks/sweeps/bias_act_gaps.py > "$RES/probes/bias_act_gaps.txt"
      run python3 benchmarks/sweeps/mlp_host.py > "$RES/probes/mlp_host.txt" ;;
    splitprobe) mkdir -p "$RES/probes"
      run python3 benchmarks/sweeps/reduce_split_probe.py > "$RES/probes/reduce_split_probe.txt" ;;
    sweep) run python3 benchmarks/sweeps/reduce_sweep.py --out "$RES/reduce_sweep.json" ;;
    profiles)
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
