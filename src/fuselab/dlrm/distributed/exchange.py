"""The autograd functions of the sharded collection's exchanges (:mod:`.embedding`): :class:`Exchange` (an
``all_to_all_single`` whose backward is the reverse exchange) and :class:`TableOrder` (the owners' blocks and the
replicated tables' rows put in table order, and back)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Exchange", "TableOrder"]


class Exchange(torch.autograd.Function):
    """all_to_all_single along dim 0 of flat tensors, sent as ``wire_dtype`` (None: as they are; the result stays in
    it). Backward: the reverse exchange in the gradient's dtype, then one pass that scales it by ``scale`` and casts
    it to the input's dtype."""

    @staticmethod
    def forward(ctx, send: Tensor, send_splits: list[int], recv_splits: list[int], group, scale: float,
                wire_dtype: torch.dtype | None = None) -> Tensor:
        ctx.splits, ctx.group, ctx.scale, ctx.in_dtype = (send_splits, recv_splits), group, scale, send.dtype
        wire = send if wire_dtype is None else send.to(wire_dtype)
        recv = wire.new_empty(sum(recv_splits))
        dist.all_to_all_single(recv, wire.contiguous(), recv_splits, send_splits, group=group)
        return recv

    @staticmethod
    def backward(ctx, grad: Tensor):
        send_splits, recv_splits = ctx.splits
        out = grad.new_empty(sum(send_splits))
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        if ctx.scale != 1.0:  # a 1-element tensor of the input's dtype: the product is computed and kept in it
            out = out * torch.full((1,), ctx.scale, dtype=ctx.in_dtype, device=out.device)
        return out.to(ctx.in_dtype), None, None, None, None, None


def _as_words(src: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
    """``src`` and ``dst`` with their last dim viewed as 64-bit words where both rows' bytes and alignment allow it
    (index copies of 32-byte rows then move 4 words each instead of 16 bf16 values), else both as they are."""
    if src.shape[-1] * src.element_size() % 8 or src.element_size() >= 8:
        return src, dst
    try:
        return src.view(torch.int64), dst.view(torch.int64)
    except RuntimeError:  # a stride or storage offset that is not a whole word
        return src, dst


class TableOrder(torch.autograd.Function):
    """The owners' blocks of pooled rows, back to back in ``flat`` (owner q's ``(B, K_q, D)``), and the replicated
    tables' rows ``replicated`` ``(B, F_r, D)`` (tables ``replicated_tables``; F_r may be 0) -> ``(B, F, D)`` in
    table order, in ``flat``'s dtype. Forward: one ``index_copy_`` along the table dim per block; backward: one
    ``index_copy_`` of the gradient's rows into [the flat layout, then the replicated block] (``row_index`` (B, F):
    the row of (b, f) there, viewed as rows of D). Both on 64-bit words: on an H100, ``index_select`` of the
    (B*F, D) rows took 1.03 ms where these take 58 and 56 µs (B = 65536, F = 26, D = 16 bf16;
    ``benchmarks/results/h100/table_order.json``)."""

    @staticmethod
    def forward(ctx, flat: Tensor, batch: int, owner_tables: Sequence[Tensor], row_index: Tensor,
                replicated: Tensor, replicated_tables: Tensor) -> Tensor:
        dim = replicated.shape[-1]
        ctx.save_for_backward(row_index)
        ctx.flat_rows, ctx.replicated_dtype = flat.numel() // dim, replicated.dtype
        out = flat.new_empty(batch, row_index.shape[1], dim)
        src, dst = _as_words(flat.view(-1, dim), out)
        start = 0
        for tables in owner_tables:  # owner q's rows [start, start + B*K_q) hold its tables for every sample
            count = batch * tables.numel()
            if count:
                dst.index_copy_(1, tables, src[start: start + count].view(batch, tables.numel(), src.shape[-1]))
            start += count
        if replicated_tables.numel():
            rows, dst = _as_words(replicated.to(out.dtype), out)
            dst.index_copy_(1, replicated_tables, rows)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (row_index,) = ctx.saved_tensors
        grad = grad.contiguous()
        rows = grad.new_empty(row_index.numel(), grad.shape[-1])
        src, dst = _as_words(grad, rows)
        dst.index_copy_(0, row_index.reshape(-1), src.reshape(-1, src.shape[-1]))
        flat, replicated = rows[: ctx.flat_rows], rows[ctx.flat_rows:]
        batch, dim = grad.shape[0], grad.shape[-1]
        replicated = replicated.view(batch, replicated.shape[0] // batch, dim).to(ctx.replicated_dtype)
        return flat.reshape(-1), None, None, None, replicated, None
