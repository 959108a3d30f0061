"""Does the ranks' stop agreement (one all-reduce read back on the host every ``AGREE_EVERY`` steps) cost the
``--nproc`` run its efficiency? Run one rank of ``fuselab ARGS`` with another interval, under torchrun:

    torchrun --nproc-per-node 2 benchmarks/gpu_checks/agree_probe.py 1000 dlrm train --config kaggle ...
"""

from __future__ import annotations

import sys

from fuselab.cli import main
from fuselab.dlrm.distributed.hybrid import HybridParallel

if __name__ == "__main__":
    HybridParallel.AGREE_EVERY = int(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
