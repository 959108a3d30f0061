"""Timing events around the collectives of a captured step: :class:`CollectiveTimeline` (used by
``dlrm_scaling.py --timeline``)."""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist


class CollectiveTimeline:
    """While active, every ``all_to_all_single`` / ``all_reduce`` issued during a CUDA graph capture is bracketed by
    two timing events recorded into the graph (``external=True``): one replay then gives each collective's time
    (its transfer plus any wait for the other ranks) and the compute between collectives, on this rank."""

    NAMES = ("all_to_all_single", "all_reduce")

    def __init__(self, side_stream: torch.cuda.Stream | None = None) -> None:
        self.side_stream = side_stream  # the step's side stream (overlap), to tell where each collective ran
        self.marks: list[tuple[str, torch.cuda.Event, torch.cuda.Event, str]] = []
        self._saved: dict[str, Any] = {}

    def _wrap(self, name: str, call):
        def wrapped(*args, **kwargs):
            if not torch.cuda.is_current_stream_capturing():
                return call(*args, **kwargs)
            begin, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
            begin.record()
            result = call(*args, **kwargs)
            end.record()
            where = "side" if torch.cuda.current_stream() == self.side_stream else "main"
            self.marks.append((name, begin, end, where))
            return result
        return wrapped

    def __enter__(self) -> CollectiveTimeline:
        for name in self.NAMES:
            self._saved[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, call in self._saved.items():
            setattr(dist, name, call)

    def replay(self, step, batches, replays: int = 10) -> list[dict[str, Any]]:
        """Each collective's begin and end, µs after the step's start (median over ``replays`` steps), the stream
        it was issued from, and the step's end: with the lookup on a side stream, the bottom MLP's work runs
        between the first collective's begin and the last forward collective's end."""
        rows: list[list[float]] = []
        for k in range(replays):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(*batches[k % len(batches)])
            stop.record()
            stop.synchronize()
            rows.append([1e3 * start.elapsed_time(ev) for _, b0, e0, _ in self.marks for ev in (b0, e0)]
                        + [1e3 * start.elapsed_time(stop)])
        med = [statistics.median(col) for col in zip(*rows)]
        out = [{"segment": name, "stream": where, "begin_us": med[2 * i], "end_us": med[2 * i + 1]}
               for i, (name, _, _, where) in enumerate(self.marks)]
        return [*out, {"segment": "step", "end_us": med[-1]}]
