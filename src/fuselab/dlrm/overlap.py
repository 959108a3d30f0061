"""The lookup beside the dense part: :class:`SideStream`, a second CUDA stream for the sparse arch's work.

A training step with overlap (:class:`fuselab.dlrm.step.TrainStep` ``overlap=True``) runs, on CUDA:

* forward: the lookup (and, on several ranks, the ids' exchange and the pooled rows' exchange) on the side stream,
  the bottom MLP on the step's stream at the same time; the step's stream waits for the side stream (:meth:`join`)
  before the interaction;
* backward: autograd runs every backward op on the stream of its forward op, so the embedding gradient's exchange and
  the fused update run on the side stream beside the bottom MLP's backward, the dense all-reduce and the dense
  update; the step joins the side stream once at its end.

Inside a CUDA graph capture the side stream forks from and joins back into the capturing stream, so the graph holds
both branches. On a CPU every method is a no-op and the step runs its ops in program order.

Autograd makes the caller's stream wait, at the end of ``backward()``, for the streams on which leaf gradients were
accumulated. The sparse arch's ``grad_anchor`` (the leaf through which autograd reaches the update) would put the
side stream among them and make the dense all-reduce wait for the update; :meth:`fork` therefore creates the
sparse arch's leaf accumulators on the step's stream before it switches streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

__all__ = ["SideStream"]


class SideStream:
    """A second stream on ``device`` (CUDA), or nothing (any other device: every method is a no-op)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def fork(self, module: nn.Module) -> Iterator[None]:
        """Run the block on the side stream, after everything queued so far on the current stream. ``module``: the
        sparse arch whose forward runs in the block (its leaf accumulators are pinned to the current stream)."""
        if self.stream is None:
            yield
            return
        # a view of each leaf creates its gradient accumulator now, on this stream; the lookup's graph then
        # reuses that accumulator (autograd keeps one per leaf while any graph holds it)
        pins = [p.view_as(p) for p in module.parameters() if p.requires_grad] if torch.is_grad_enabled() else []
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        del pins

    @contextlib.contextmanager
    def after_its_work(self) -> Iterator[None]:
        """Run the block on the side stream after what it already holds (the embedding update), without waiting
        for the current stream: the next batch's ids exchange (pipelining) beside the dense update."""
        if self.stream is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield

    def join(self, *tensors: Tensor) -> None:
        """Make the current stream wait for the side stream; ``tensors`` made on the side stream and used on the
        current one are recorded on it (outside a graph capture) so that their memory is not reused early."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        if not torch.cuda.is_current_stream_capturing():
            for t in tensors:
                t.record_stream(current)
