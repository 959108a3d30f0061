"""Drop-in replacements for Hugging Face transformers functions, backed by fuselab kernels.

``apply_rotary_pos_emb`` takes exactly the arguments of the function in transformers' Llama model
and returns the same values, from one fused launch for q and k (no cos/sin copies: the kernel reads
the first half of HF's duplicated tables through their strides). Patch a model with e.g.
``transformers.models.llama.modeling_llama.apply_rotary_pos_emb = fuselab.hf.apply_rotary_pos_emb``.
"""

from __future__ import annotations

import torch

from fuselab.backend import use_triton
from fuselab.core.checks import require_float, require_same_device
from fuselab.ops.rope.op import rotate_by_tables
from fuselab.reference import rope as _ref


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: torch.Tensor | None = None,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``q * cos + rotate_half(q) * sin`` (and for k), fused.

    Args:
        q, k: ``(batch, heads, seq, head_dim)`` when ``unsqueeze_dim=1`` (HF's default), or
            ``(batch, seq, heads, head_dim)`` when ``unsqueeze_dim=2``; head counts may differ (GQA).
        cos, sin: HF's tables ``(batch or 1, seq, rotary_dim)`` (or ``(seq, rotary_dim)``) whose two
            halves are equal, as every HF rotary embedding produces; only the first half is read.
            ``rotary_dim < head_dim`` rotates the leading dims and passes the rest through.
        position_ids: ignored, as in transformers (kept for signature compatibility).
        unsqueeze_dim: 1 (or -3) or 2 (or -2), as in transformers.

    Returns ``(q_embed, k_embed)`` in q's and k's dtypes (HF promotes to cos's dtype when it differs;
    HF models cast cos/sin to q's dtype first, so the values agree). Differentiable; traceable by
    ``torch.compile``. Raises ``ValueError``/``TypeError`` for shapes, dtypes or devices that do not fit.
    """
    del position_ids
    if unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(f"unsqueeze_dim must be 1 (q (batch, heads, seq, head_dim)) or 2 "
                         f"(q (batch, seq, heads, head_dim)), got {unsqueeze_dim}")
    layout = "bhsd" if unsqueeze_dim in (1, -3) else "bshd"
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        require_float(name, t)
    require_same_device(q=q, k=k, cos=cos, sin=sin)
    want = "(batch, heads, seq, head_dim)" if layout == "bhsd" else "(batch, seq, heads, head_dim)"
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims {want} for unsqueeze_dim={unsqueeze_dim}, got {tuple(t.shape)}")
    s_ax = 2 if layout == "bhsd" else 1
    batch, seqlen, head_dim = q.shape[0], q.shape[s_ax], q.shape[3]
    if (k.shape[0], k.shape[s_ax], k.shape[3]) != (batch, seqlen, head_dim):
        raise ValueError(f"k must match q in batch, seq and head_dim {want}: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seqlen:
        raise ValueError(f"cos must have shape (batch or 1, seq, rotary_dim) = ({batch}, {seqlen}, rotary_dim), "
                         f"got {tuple(cos.shape)}")
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    rotary_dim = cos.shape[2]
    if rotary_dim == 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"cos.shape[-1] (rotary_dim) must be even, > 0 and <= head_dim ({head_dim}), got {rotary_dim}")
    half = rotary_dim // 2
    cos_h, sin_h = cos[..., :half], sin[..., :half]  # views: HF duplicates the halves
    if not use_triton(q.device):
        head_ax = 1 if layout == "bhsd" else 2
        c, s = cos_h.unsqueeze(head_ax), sin_h.unsqueeze(head_ax)
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        c, s = c.to(compute), s.to(compute)
        return (_ref.rotate(q.to(compute), c, s, False).to(q.dtype),
                _ref.rotate(k.to(compute), c, s, False).to(k.dtype))
    return rotate_by_tables(q, k, cos_h, sin_h, layout)
