"""Small DLRMs for the tests, built the one way a model is built: a config through ``DLRM.from_config``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuselab.dlrm.config import DLRMConfig
from fuselab.dlrm.model import DLRM


def tiny_config(**fields: Any) -> DLRMConfig:
    """D=4, bottom 13-8-4, top 6-1, seed 3, and ``fields`` (any config field, e.g. ``optimizer``, ``interaction``)."""
    values: dict[str, Any] = {"name": "test", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [6, 1], "seed": 3}
    values.update(fields)
    return DLRMConfig(**values).validate()


def tiny_model(sizes: Sequence[int], kernels: str = "torch", mlp: str | None = None, **fields: Any) -> DLRM:
    """The :func:`tiny_config` model over tables of ``sizes`` rows."""
    return DLRM.from_config(tiny_config(**fields), sizes, kernels=kernels, mlp=mlp)
