"""The measurement lab: correctness against a float64 reference, then timing, ceilings, reports.

Entry points: :func:`run` (what ``fuselab bench`` calls, same defaults via :class:`BenchOptions`),
:func:`compare` (``fuselab bench compare``), :func:`load` (read a result JSON). Names resolve
lazily so ``import fuselab.bench`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {
    "run": "fuselab.bench.lab",
    "BenchOptions": "fuselab.bench.options",
    "default_out_dir": "fuselab.bench.options",
    "compare": "fuselab.bench.compare",
    "load": "fuselab.bench.results",
    "save": "fuselab.bench.results",
    "Result": "fuselab.bench.results",
    "OpRun": "fuselab.bench.results",
    "Ceilings": "fuselab.bench.ceilings",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fuselab.bench' has no attribute {name!r}")
