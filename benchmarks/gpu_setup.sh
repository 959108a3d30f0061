# Sourced by benchmarks/gpu_run.sh at the start of every device-machine command.
# The GPU machine has torch, triton, rich, matplotlib, pandas, pyarrow and tensorboard, and no network:
# peers come as wheels carried in .whl/, fuselab installs editable without build isolation.
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip-fuselab.log 2>&1 || { cat /tmp/pip-fuselab.log; exit 1; }
GPU_SLUG=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print('h200' if 'h200' in n else 'h100' if 'h100' in n else n.split()[-1])")
export GPU_SLUG
echo "GPU: $GPU_SLUG  torch $(python3 -c 'import torch;print(torch.__version__)')  triton $(python3 -c 'import triton;print(triton.__version__)')"
