"""Pure-PyTorch dot interaction of the DLRM: the CPU path of :func:`fuselab.dot_interaction` and the lab's oracle.

``dot_interaction(dense, emb)``: dense ``(B, D)``, emb ``(B, F, D)`` -> ``(B, W)`` laid out as
``[dense, pairs..., zeros]``. The ``F+1`` vectors are ``v_0 = dense`` and ``v_1..v_F = emb[:, 0..F-1]``; the
pairs are the strict lower triangle of the Gram matrix ``Z = V Vᵀ`` in row-major order, pair ``(i, j)``, ``j < i``,
at index ``i(i-1)/2 + j`` (with ``self_interaction`` the diagonal too: ``(i, j)``, ``j <= i``, at
``i(i+1)/2 + j``). ``W = D + P`` rounded up to a multiple of ``pad_to``; the padding columns are zeros.

Low-precision inputs are computed in float32 and the result cast back (the kernels do the same); float64 stays
float64. Everything here is differentiable by autograd; :func:`dot_interaction_backward` is the backward written
out (the custom op's backward off the Triton path).
"""

from __future__ import annotations

import torch

#: largest embedding dim and number of sparse features the op accepts (the kernels tile both)
MAX_DIM = 256
MAX_FEATURES = 128


def num_pairs(num_sparse: int, self_interaction: bool = False) -> int:
    """P: ``(F+1)F/2`` dot products, ``(F+1)(F+2)/2`` with the diagonal."""
    n = num_sparse + 1
    return n * (n + 1) // 2 if self_interaction else n * (n - 1) // 2


def output_width(num_sparse: int, dim: int, self_interaction: bool = False, pad_to: int = 1) -> int:
    """W: ``D + P`` rounded up to a multiple of ``pad_to``."""
    width = dim + num_pairs(num_sparse, self_interaction)
    return -(-width // pad_to) * pad_to


def pair_rows_cols(num_sparse: int, self_interaction: bool = False,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``i`` and column ``j`` of each kept Gram entry in output order (int64, length P)."""
    n = num_sparse + 1
    rows, cols = torch.tril_indices(n, n, offset=0 if self_interaction else -1, device=device)
    return rows, cols  # tril_indices is row-major: (1,0), (2,0), (2,1), ...


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dot_interaction(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool = False,
                    pad_to: int = 1) -> torch.Tensor:
    """dense (B, D), emb (B, F, D) -> (B, W) in ``dense``'s dtype (bmm + gather, computed in float32/float64)."""
    acc = compute_dtype(dense.dtype)
    f, d = emb.shape[1:]
    vectors = torch.cat([dense.to(acc).unsqueeze(1), emb.to(acc)], dim=1)  # (B, F+1, D)
    gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, F+1, F+1)
    rows, cols = pair_rows_cols(f, self_interaction, dense.device)
    out = torch.cat([dense.to(acc), gram[:, rows, cols]], dim=1)
    pad = output_width(f, d, self_interaction, pad_to) - out.shape[1]
    if pad:
        out = torch.nn.functional.pad(out, (0, pad))
    return out.to(dense.dtype)


def dot_interaction_backward(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor,
                             self_interaction: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_dense, grad_emb) from the output gradient ``grad`` (B, W): ``dV = S V`` with ``S`` the symmetric matrix
    of the pair gradients (``2 g_ii`` on the diagonal with self-interaction), plus ``grad[:, :D]`` for dense.
    Padding columns of ``grad`` are ignored. Computed in float32/float64, returned in the inputs' dtypes."""
    acc = compute_dtype(dense.dtype)
    b, f, d = emb.shape
    n = f + 1
    rows, cols = pair_rows_cols(f, self_interaction, grad.device)
    pairs = grad[:, d: d + rows.numel()].to(acc)
    sym = torch.zeros(b, n, n, dtype=acc, device=grad.device)
    sym[:, rows, cols] = pairs
    sym = sym + sym.transpose(1, 2)  # the diagonal (self-interaction) is doubled: d(v·v)/dv = 2v
    vectors = torch.cat([dense.to(acc).unsqueeze(1), emb.to(acc)], dim=1)
    grad_v = torch.bmm(sym, vectors)  # (B, F+1, D)
    grad_dense = grad_v[:, 0] + grad[:, :d].to(acc)
    return grad_dense.to(dense.dtype), grad_v[:, 1:].to(emb.dtype)
