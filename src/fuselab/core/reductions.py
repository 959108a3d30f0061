"""The reduction vocabulary, defined once: how values are combined, by :func:`fuselab.sum`/:func:`fuselab.mean` and by
the embedding collection's pooling of a bag (``pooling=``)."""

from __future__ import annotations

REDUCTIONS: tuple[str, ...] = ("sum", "mean")
