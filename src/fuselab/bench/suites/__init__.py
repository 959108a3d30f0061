"""Benchmark suites, one module per op, each defining ``SPEC: OpSpec``.

The registry is a static table (no import-time discovery): adding an op means adding a line.
"""

from __future__ import annotations

import importlib

from fuselab.bench.spec import OpSpec

SUITES: dict[str, str] = {
    "square": "fuselab.bench.suites.square",
    "gelu_tanh": "fuselab.bench.suites.gelu_tanh",
    "rope": "fuselab.bench.suites.rope",
    "bias_act": "fuselab.bench.suites.bias_act",
    "mlp": "fuselab.bench.suites.mlp",
    "reduce": "fuselab.bench.suites.reduce",
    "embedding": "fuselab.bench.suites.embedding",
    "interaction": "fuselab.bench.suites.interaction",
    "gemm": "fuselab.bench.suites.gemm",
    "dlrm": "fuselab.bench.suites.dlrm",  # a whole training step; builds fuselab.dlrm models (a layer above the lab)
}


def op_names() -> list[str]:
    return list(SUITES)


def get_spec(name: str) -> OpSpec:
    """The suite of op ``name``; ``ValueError`` listing the valid ops otherwise."""
    if name not in SUITES:
        raise ValueError(f"unknown op {name!r}; valid ops: {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name]).SPEC
