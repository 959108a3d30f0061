"""The measurement lab: correctness against a float64 reference, then timing, ceilings, reports.

Entry points: :func:`run` (what ``fuselab bench`` calls, same defaults via :class:`BenchOptions`),
:func:`compare` (``fuselab bench compare``), :func:`load` (read a result JSON). Names resolve
lazily so ``import fuselab.bench`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers and "go to definition"
    from fuselab.bench.ceilings import Ceilings as Ceilings
    from fuselab.bench.compare import compare as compare
    from fuselab.bench.lab import run as run
    from fuselab.bench.options import BenchOptions as BenchOptions
    from fuselab.bench.options import default_out_dir as default_out_dir
    from fuselab.bench.results import OpRun as OpRun
    from fuselab.bench.results import Result as Result
    from fuselab.bench.results import load as load
    from fuselab.bench.results import save as save

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
