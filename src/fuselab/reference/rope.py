"""Pure-PyTorch rotary position embedding: the CPU path of :func:`fuselab.apply_rope` and the oracle.

Same semantics as the fused op (see ``docs/rope.md``), differentiable by autograd. Arithmetic runs
in float32 (float64 when q is float64, which is how the tests and the lab build their oracle) and
results are cast back to q's dtype. Inputs are assumed already validated by the public API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fuselab.core.rope_layouts import ROPE_LAYOUTS
from fuselab.core.rope_math import rope_frequencies


def to_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (batch, seq, heads, head_dim) view of ``t`` in ``layout`` (thd: batch 1, seq = tokens)."""
    view = ROPE_LAYOUTS[layout]
    return t.unsqueeze(0) if view.packed else t.permute(view.axes)


def from_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (batch, seq, heads, head_dim) tensor viewed in ``layout``."""
    view = ROPE_LAYOUTS[layout]
    return t.squeeze(0) if view.packed else t.permute(view.inverse)


def token_positions(batch: int, seqlen: int, device: torch.device, *, layout: str = "bshd",
                    positions: torch.Tensor | None = None, seqlen_offsets: int | torch.Tensor = 0,
                    cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, seq) int64 table row of every token (thd: batch 1, seq = total tokens)."""
    packed = ROPE_LAYOUTS[layout].packed
    if positions is not None:
        pos = positions.reshape(1, -1) if packed else positions
        return pos.to(device=device, dtype=torch.long).expand(batch, seqlen)
    if packed:
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        tokens = torch.arange(seqlen, device=device)
        seq = torch.searchsorted(cu[1:], tokens, right=True)
        pos = tokens - cu[seq]
        if isinstance(seqlen_offsets, torch.Tensor):
            pos = pos + seqlen_offsets.to(device=device, dtype=torch.long)[seq]
        else:
            pos = pos + int(seqlen_offsets)
        return pos[None, :]
    pos = torch.arange(seqlen, device=device)[None, :].expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        return pos + seqlen_offsets.to(device=device, dtype=torch.long)[:, None]
    return pos + int(seqlen_offsets)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` dims of ``x`` (..., D); cos/sin broadcast to (..., half)."""
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    out = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    return torch.cat((out, rest), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None, *,
               layout: str = "bshd", interleaved: bool = False, inplace: bool = False,
               positions: torch.Tensor | None = None, seqlen_offsets: int | torch.Tensor = 0,
               cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
               base: float = 10000.0, scaling: Mapping[str, Any] | None = None,
               rotary_dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference of :func:`fuselab.apply_rope` (``rotary_dim`` only matters when cos is None)."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qv = to_bshd(q, layout)
    batch, seqlen = qv.shape[0], qv.shape[1]
    pos = token_positions(batch, seqlen, q.device, layout=layout, positions=positions,
                          seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens)
    if cos is not None:
        c = cos.to(compute)[pos][:, :, None, :]
        s = sin.to(compute)[pos][:, :, None, :]
    else:
        rdim = rotary_dim if rotary_dim is not None else q.shape[-1]
        inv_freq, mscale = rope_frequencies(rdim, base, scaling)
        if compute == torch.float32:  # the kernel's arithmetic: fp32 position times fp32 frequency
            angles = pos.to(torch.float32)[..., None] * inv_freq.to(device=q.device, dtype=torch.float32)
        else:
            angles = pos.to(compute)[..., None] * inv_freq.to(device=q.device, dtype=compute)
        c = (angles.cos() * mscale)[:, :, None, :]
        s = (angles.sin() * mscale)[:, :, None, :]
    outs = []
    for t in (q, k):
        if t is None:
            outs.append(None)
            continue
        out = from_bshd(rotate(to_bshd(t, layout).to(compute), c, s, interleaved).to(t.dtype), layout)
        if inplace:
            with torch.no_grad():
                t.copy_(out)
            out = t
        outs.append(out)
    return outs[0], outs[1]

