"""Drop-in replacements for Hugging Face transformers functions, backed by fuselab kernels.

transformers' Llama ``apply_rotary_pos_emb`` has one signature per major version:

* 4.x: ``(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`` (``position_ids`` unused):
  :func:`apply_rotary_pos_emb_v4`;
* 5.x: ``(q, k, cos, sin, unsqueeze_dim=1)``: :func:`apply_rotary_pos_emb_v5`.

``fuselab.hf.apply_rotary_pos_emb`` is the one of the transformers installed: the version of the ``transformers``
module already imported, else the installed package's metadata (transformers is not imported for it); 5.x's when
transformers is not installed or is newer than 5.x. Both return the library's values from one fused launch for q
and k (no cos/sin copies: the kernel reads the first half of HF's duplicated tables through their strides). Patch
a model with e.g.
``transformers.models.llama.modeling_llama.apply_rotary_pos_emb = fuselab.hf.apply_rotary_pos_emb``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Callable

import torch

from fuselab.backend import use_triton
from fuselab.core.checks import require_float, require_same_device
from fuselab.ops.rope.op import rotate_by_tables
from fuselab.reference import rope as _ref

# apply_rotary_pos_emb is resolved by the module's __getattr__ on each access
__all__ = ["apply_rotary_pos_emb", "apply_rotary_pos_emb_v4", "apply_rotary_pos_emb_v5", "signature_for"]  # noqa: F822

_UNSQUEEZE_DIMS = {1: "bhsd", -3: "bhsd", 2: "bshd", -2: "bshd"}


def _layout(unsqueeze_dim: object, signature: str) -> str:
    if isinstance(unsqueeze_dim, bool) or not isinstance(unsqueeze_dim, int):
        hint = ""
        if isinstance(unsqueeze_dim, torch.Tensor) and signature == "5.x":
            hint = (" (transformers 5.x's apply_rotary_pos_emb has no position_ids parameter: its fifth argument is "
                    "unsqueeze_dim)")
        raise TypeError(f"unsqueeze_dim must be an int, got {type(unsqueeze_dim).__name__}{hint}")
    if unsqueeze_dim not in _UNSQUEEZE_DIMS:
        raise ValueError(f"unsqueeze_dim must be 1 (or -3: q (batch, heads, seq, head_dim)) or 2 "
                         f"(or -2: q (batch, seq, heads, head_dim)), got {unsqueeze_dim}")
    return _UNSQUEEZE_DIMS[unsqueeze_dim]


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
           unsqueeze_dim: int) -> int:
    """The shapes transformers' function broadcasts to a rotation; returns rotary_dim // 2."""
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
    if cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seqlen:
        raise ValueError(f"cos must have shape (batch or 1, seq, rotary_dim) = ({batch}, {seqlen}, rotary_dim), as "
                         f"transformers' rotary embeddings make it, got {tuple(cos.shape)} (transformers broadcasts "
                         f"cos.unsqueeze(unsqueeze_dim) against q: a table of another rank meets other axes)")
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    rotary_dim = cos.shape[2]
    if rotary_dim == 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"cos.shape[-1] (rotary_dim) must be even, > 0 and <= head_dim ({head_dim}), got {rotary_dim}")
    return rotary_dim // 2


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: object,
            signature: str) -> tuple[torch.Tensor, torch.Tensor]:
    layout = _layout(unsqueeze_dim, signature)
    half = _check(q, k, cos, sin, layout, unsqueeze_dim)
    # transformers' q * cos + rotate_half(q) * sin promotes: the output dtype is q's, cos's and sin's common one
    table = torch.promote_types(cos.dtype, sin.dtype)
    q_dtype, k_dtype = torch.promote_types(q.dtype, table), torch.promote_types(k.dtype, table)
    q, k = q.to(q_dtype), k.to(k_dtype)  # no copy unless a table's dtype is wider than q's or k's
    cos_h, sin_h = cos[..., :half], sin[..., :half]  # views: HF duplicates the halves
    if not use_triton(q.device):
        head_ax = 1 if layout == "bhsd" else 2
        c, s = cos_h.detach().unsqueeze(head_ax), sin_h.detach().unsqueeze(head_ax)  # no gradient, as the kernel's
        outs = []
        for t in (q, k):
            compute = torch.float64 if t.dtype == torch.float64 else torch.float32
            outs.append(_ref.rotate(t.to(compute), c.to(compute), s.to(compute), False).to(t.dtype))
        return outs[0], outs[1]
    if q_dtype == k_dtype:
        return rotate_by_tables(q, k, cos_h, sin_h, layout)
    q_out = rotate_by_tables(q, None, cos_h, sin_h, layout)[0]
    k_out = rotate_by_tables(k, None, cos_h, sin_h, layout)[0]
    return q_out, k_out


def apply_rotary_pos_emb_v5(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 5.x's Llama ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin`` (and for k), fused.

    Args:
        q, k: ``(batch, heads, seq, head_dim)`` when ``unsqueeze_dim`` is 1 or -3 (HF's default), or
            ``(batch, seq, heads, head_dim)`` when it is 2 or -2; head counts may differ (GQA).
        cos, sin: HF's tables ``(batch or 1, seq, rotary_dim)`` whose two halves are equal, as every HF rotary
            embedding produces; only the first half is read. ``rotary_dim < head_dim`` rotates the leading dims
            and passes the rest through (as the partial-rotary models' variants of the function do).
        unsqueeze_dim: the axis HF unsqueezes cos and sin at (1, 2, -3 or -2).

    Returns ``(q_embed, k_embed)``, each in the dtype transformers gives it: the common dtype of the tensor, cos
    and sin (HF models cast cos and sin to q's dtype first; a wider table's dtype makes a widened copy of q or k).
    Arithmetic is float32 (float64 for float64 tensors) with one rounding, where transformers rounds after each
    product and the sum in low precision. Differentiable in q and k (not in cos and sin: HF's come from buffers);
    traceable by ``torch.compile``. Raises ``TypeError`` for
    a non-int ``unsqueeze_dim`` (e.g. a position_ids tensor passed in 4.x's place) or non-float tensors,
    ``ValueError`` for shapes or devices that do not fit (a 2-D table among them: transformers would broadcast it
    against other axes).
    """
    return _rotate(q, k, cos, sin, unsqueeze_dim, "5.x")


def apply_rotary_pos_emb_v4(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            position_ids: torch.Tensor | None = None,
                            unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 4.x's Llama ``apply_rotary_pos_emb``: :func:`apply_rotary_pos_emb_v5` with 4.x's signature.

    ``position_ids`` is unused, as in transformers 4.x (the tables are already gathered per position); it must be
    a tensor or None: anything else (e.g. an int meant as ``unsqueeze_dim``, which transformers 4.x would ignore
    and rotate along axis 1) raises ``TypeError``. The other arguments, the result and the errors are those of
    :func:`apply_rotary_pos_emb_v5`. The 4.x releases whose rotary embeddings return 2-D ``(seq, dim)`` tables
    indexed by ``position_ids`` inside this function are not followed: their 2-D tables raise ``ValueError``.
    """
    if position_ids is not None and not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a tensor or None (unused, as in transformers 4.x), got "
                        f"{type(position_ids).__name__}: pass unsqueeze_dim by keyword")
    return _rotate(q, k, cos, sin, unsqueeze_dim, "4.x")


def signature_for(version: str | None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The function whose signature is that of transformers ``version`` (e.g. ``"4.57.6"``; None: not installed):
    :func:`apply_rotary_pos_emb_v4` for 4.x and older, else :func:`apply_rotary_pos_emb_v5`."""
    if version is None:
        return apply_rotary_pos_emb_v5
    major = version.split(".", 1)[0]
    if not major.isdigit():
        raise ValueError(f"version must look like '5.2.0', got {version!r}")
    return apply_rotary_pos_emb_v4 if int(major) <= 4 else apply_rotary_pos_emb_v5


@functools.cache
def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def _transformers_version() -> str | None:
    module = sys.modules.get("transformers")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else _installed_version()


def __getattr__(name: str) -> object:
    if name == "apply_rotary_pos_emb":
        return signature_for(_transformers_version())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "apply_rotary_pos_emb"})
