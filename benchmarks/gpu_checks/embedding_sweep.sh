set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
bash .peers/torchrec/unpack.sh /tmp/trsite > /dev/null 2>&1 || echo "peers: unpack failed"
export PYTHONPATH="/tmp/trsite/main:$PWD/src"
python3 benchmarks/gpu_checks/multihot_embedding.py --scale 0.01 0.1 2>&1 | grep -v Warning | tail -15
timeout 300 python3 -m pytest -q -p no:cacheprovider -x --tb=short tests/bench/test_dlrm_suite.py -m gpu 2>&1 | grep -E "Error|error|assert|passed|failed" | head -12
