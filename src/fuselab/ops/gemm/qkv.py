"""The fused QKV projection with RoPE in the epilogue: q and k leave the GEMM rotated, v untouched; the backward
rotates dq and dk back as they are loaded. The ops ``fuselab::qkv_rope`` / ``fuselab::qkv_rope_bwd`` and the public
:func:`qkv_rope` (``docs/gemm.md``); the RoPE options and their checks are :func:`fuselab.apply_rope`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fuselab.backend import use_triton
from fuselab.core.checks import rows
from fuselab.ops._recordop import RecordOp, layout
from fuselab.reference import gemm as ref

from .checks import QkvCall, validate_qkv
from .lazy import steps
from .spec import RopeArgs, RopeSpec

__all__ = ["QKV", "qkv_rope"]

# ---------------------------------------------------------------------------------------------- launch geometry
def _geometry(call: QkvCall) -> tuple[RopeSpec, RopeArgs]:
    """(RopeSpec, RopeArgs) of a call: how a row of x finds its token's (batch, index) and position."""
    lead = call.x.shape[:-1]
    if call.layout == "thd":
        div_b, mod_b, div_s, mod_s = 1, 1, 1, max(lead[0], 1)
    elif call.layout == "sbhd":
        div_b, mod_b, div_s, mod_s = 1, lead[1], lead[1], lead[0]
    else:
        div_b, mod_b, div_s, mod_s = lead[1], lead[0], 1, lead[1]
    pos = call.positions
    if pos is not None:
        pos = pos.view(1, -1) if pos.dim() == 1 else pos
        pos = pos.as_strided(pos.shape, (0 if pos.shape[0] == 1 else pos.stride(0), pos.stride(1)))
    offsets, cu = call.offsets, call.cu_seqlens
    packed = cu is not None and pos is None
    mode = 2 if pos is not None else (3 if offsets is None else 4) if packed else (0 if offsets is None else 1)
    n_seq = cu.shape[0] - 1 if cu is not None else 1
    spec = RopeSpec(pair_stride=1 if call.interleaved else call.half, half=call.half, head_dim=call.head_dim,
                    rot_cols=(call.num_heads + call.num_kv_heads) * call.head_dim, use_table=call.cos is not None,
                    pos_mode=mode, search_steps=max(1, n_seq.bit_length()))
    args = RopeArgs(cos=call.cos, sin=call.sin, freq=call.freq, positions=pos, offsets=offsets, cu_seqlens=cu,
                    offset=call.offset, mscale=call.mscale, div_b=div_b, mod_b=mod_b, div_s=div_s, mod_s=mod_s)
    return spec, args


# ---------------------------------------------------------------------------------------------- op
def _forward(*inputs, prepared=None) -> tuple:
    """(the fused projection ``[M, N]`` with q and k rotated, None) of the custom op's inputs
    (:attr:`QkvCall.inputs`)."""
    call = QkvCall.from_inputs(inputs)
    x2 = rows(call.x)
    out = call.x.new_empty((x2.shape[0], call.weight.shape[0]))
    if out.numel() == 0:
        return out, None
    if not use_triton(call.x.device):
        with torch.no_grad():
            out.copy_(_reference(call, call.x, call.weight, call.bias))
        return out, None
    steps().qkv_forward(x2, call.weight, call.bias, out, *_geometry(call))
    return out, None


def _reference(call: QkvCall, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The fused projection ``[M, N]`` of ``x``, ``weight``, ``bias`` with ``call``'s rotation, by the reference
    (the projection, then :func:`fuselab.reference.rope.apply_rope`)."""
    rope = dict(cos=call.cos, sin=call.sin, layout=call.layout, interleaved=call.interleaved,
                positions=call.positions, seqlen_offsets=call.offsets if call.offsets is not None else call.offset,
                cu_seqlens=call.cu_seqlens, rotary_dim=2 * call.half)
    q, k, v = ref.qkv_rope(x, weight, bias, call.num_heads, call.num_kv_heads, rope)
    if call.layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return torch.cat([t.flatten(-2) for t in (q, k, v)], dim=-1).reshape(-1, weight.shape[0])


def _forward_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor | None,
                  sin: torch.Tensor | None, freq: torch.Tensor | None, positions: torch.Tensor | None,
                  offsets: torch.Tensor | None, cu_seqlens: torch.Tensor | None, lay: str, num_heads: int,
                  num_kv_heads: int, half: int, interleaved: bool, offset: int, mscale: float) -> torch.Tensor:
    return x.new_empty((math.prod(x.shape[:-1]), weight.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, *rope_tensors = inputs[:9]
    ctx.save_for_backward(x, weight, *rope_tensors)
    ctx.scalars = inputs[9:]
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad) -> tuple:
    """Gradients of x, weight and bias: one :data:`QKV_BACKWARD` call."""
    x, weight, *rope_tensors = ctx.saved_tensors
    want = [bool(w) for w in ctx.needs_input_grad[:3]]
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("qkv_bwd", key, tuple(want), layout(grad))
    dx, dw, db = QKV_BACKWARD.run_in_backward(ctx, (grad, x, weight, *rope_tensors, *ctx.scalars, want), key)
    return (dx.view(x.shape) if want[0] else None, dw if want[1] else None,
            db.to(ctx.bias_dtype) if want[2] else None, *(None,) * 13)


QKV = RecordOp("fuselab::qkv_rope", eager=_forward, fake=_forward_fake, autograd=(_setup_context, _backward),
               differentiable=(0, 1, 2))


def _backward_launch(grad, *inputs, prepared=None) -> tuple:
    """((dx, dw, db), None) of dY and the backward op's other inputs: x, weight, the rotation's tensors and scalars
    (:attr:`QkvCall.inputs` without the bias), the gradients wanted."""
    *rest, want = inputs
    call = QkvCall.from_inputs((*rest[:2], None, *rest[2:]))
    want = [bool(w) for w in want]
    if grad.numel() == 0 or not use_triton(grad.device):
        return _backward_torch(grad, call, want), None
    g = grad if grad.dtype == call.x.dtype else grad.to(call.x.dtype)
    return steps().qkv_backward(g, rows(call.x), call.weight, *_geometry(call), want), None


def _backward_torch(grad: torch.Tensor, call: QkvCall, want: list[bool]) -> tuple:
    """The backward on the PyTorch path: autograd through the reference (float32; float64 stays)."""
    x, weight = call.x, call.weight
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs, ws = x.detach().to(acc).requires_grad_(want[0]), weight.detach().to(acc).requires_grad_(want[1])
    bs = torch.zeros(weight.shape[0], dtype=acc, device=x.device, requires_grad=want[2])
    leaves = [t for t, w in zip((xs, ws, bs), want) if w]
    with torch.enable_grad():
        y = _reference(call, xs, ws, bs)
        grads = iter(torch.autograd.grad(y, leaves, grad.to(acc)) if leaves else ())
    return tuple(next(grads).to(acc if i == 2 else x.dtype) if w else grad.new_empty(0) for i, w in enumerate(want))


def _backward_fake(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor | None,
                   sin: torch.Tensor | None, freq: torch.Tensor | None, positions: torch.Tensor | None,
                   offsets: torch.Tensor | None, cu_seqlens: torch.Tensor | None, lay: str, num_heads: int,
                   num_kv_heads: int, half: int, interleaved: bool, offset: int, mscale: float,
                   want: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    m = math.prod(x.shape[:-1])
    shapes = ((m, x.shape[-1]), weight.shape, (weight.shape[0],))
    return tuple(grad.new_empty(s, dtype=acc if i == 2 else x.dtype) if w else grad.new_empty(0)
                 for i, (w, s) in enumerate(zip(want, shapes)))


QKV_BACKWARD = RecordOp("fuselab::qkv_rope_bwd", eager=_backward_launch, fake=_backward_fake)


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, num_heads: int,
             num_kv_heads: int, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
             layout: str = "bshd", interleaved: bool = False, positions: torch.Tensor | None = None,
             seqlen_offsets: int | torch.Tensor = 0, cu_seqlens: torch.Tensor | None = None,
             max_seqlen: int | None = None, base: float = 10000.0, scaling: Mapping[str, Any] | None = None,
             rotary_dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of the fused projection ``x @ weight.T + bias``, q and k rotated by RoPE in the GEMM's epilogue: the
    values of ``fuselab.apply_rope`` on the plain projection's q and k, in one launch. Differentiable in x, weight
    and bias (the backward rotates dq and dk back as it loads them).

    Args:
        x: ``(batch, seq, hidden)`` for layouts bshd and bhsd, ``(seq, batch, hidden)`` for sbhd,
            ``(total_tokens, hidden)`` for thd.
        weight: ``((num_heads + 2 * num_kv_heads) * head_dim, hidden)``: the q, k and v projections stacked (GQA:
            ``num_kv_heads`` divides nothing here, any counts). bias: its rows' bias or None.
        num_heads, num_kv_heads: heads of q and of k and v.
        cos, sin, layout, interleaved, positions, seqlen_offsets, cu_seqlens, max_seqlen, base, scaling,
            rotary_dim: as :func:`fuselab.apply_rope` (tables or in-kernel angles, partial rotary, positions,
            KV-cache offsets, packed sequences).

    Returns:
        q ``(..., num_heads, head_dim)``, k and v ``(..., num_kv_heads, head_dim)`` in ``layout``: views of one
        ``(tokens, (num_heads + 2 * num_kv_heads) * head_dim)`` tensor (bhsd: transposed views).

    Raises:
        TypeError / ValueError: as :func:`fuselab.apply_rope` for the RoPE options; x of the wrong rank for the
        layout, a weight whose rows are not a multiple of the heads, tensors of other dtypes or devices; for the
        half-split rotation a ``rotary_dim`` that is not a power of 2 dividing head_dim (the fused epilogue's limit).
    """
    rope = dict(cos=cos, sin=sin, layout=layout, interleaved=interleaved, positions=positions,
                seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, base=base,
                scaling=scaling, rotary_dim=rotary_dim)
    call = validate_qkv(x, weight, bias, num_heads, num_kv_heads, rope)
    if not torch.compiler.is_compiling() and not use_triton(x.device):
        return ref.qkv_rope(x, weight, bias, num_heads, num_kv_heads, rope)
    qkv = QKV.run(call.inputs)
    heads = qkv.view(*x.shape[:-1], num_heads + 2 * num_kv_heads, call.head_dim)
    q, k, v = heads.split((num_heads, num_kv_heads, num_kv_heads), dim=-2)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return q, k, v
