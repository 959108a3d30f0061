"""The DCNv2 cross-network interaction (MLPerf DLRM-DCNv2), low-rank as torchrec's ``LowRankCrossNet``.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim (= the dense arch's output width),
``N = (F + 1) * D`` the width of the cross network.

The interaction flattens ``x_0 = [dense, emb_1, ..., emb_F]`` to ``(B, N)`` and applies ``num_layers`` cross layers

    x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l

with ``V_l`` ``(r, N)``, ``W_l`` ``(N, r)`` (rank ``r = low_rank``) and ``b_l`` ``(N,)``; the output ``(B, N)`` goes
to the over arch. Initialisation as the reference: ``V_l``, ``W_l`` Xavier-normal, ``b_l`` zero.
MLPerf DLRM-DCNv2: ``{"kind": "dcn", "layers": 3, "low_rank": 512}``, D = 128, F = 26 (N = 3456).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from fuselab.core.seeded import seeded_fill_
from fuselab.ops.gemm import dcn_cross_net

from .base import InteractionConfig, positive_int

__all__ = ["DCNConfig", "DCNInteraction", "LowRankCrossNet"]


@dataclass(frozen=True)
class DCNConfig(InteractionConfig):
    """``{"kind": "dcn", "layers": 3, "low_rank": 512}``: cross layers and their rank (positive ints)."""

    kind: ClassVar[str] = "dcn"
    layers: int = 3
    low_rank: int = 512

    def __post_init__(self) -> None:
        positive_int("layers", self.layers)
        positive_int("low_rank", self.low_rank)


class LowRankCrossNet(nn.Module):
    """``num_layers`` low-rank cross layers on ``(B, N)``: ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``.

    ``fused``: each layer is one :func:`fuselab.ops.gemm.dcn_cross` (the bias, the product with ``x_0`` and the
    residual in the second GEMM's epilogue, its backward's element-wise part in one pass); under autocast it casts
    x_0 and the weights to the autocast dtype itself and runs with autocast off, as autocast does for ``F.linear``.
    Otherwise PyTorch ops (two ``F.linear`` and an ``addcmul`` per layer). Raises ``ValueError`` for non-positive
    sizes."""

    def __init__(self, in_features: int, num_layers: int = 3, low_rank: int = 512,
                 generator: torch.Generator | None = None, fused: bool = False):
        super().__init__()
        if in_features <= 0 or num_layers <= 0 or low_rank <= 0:
            raise ValueError(f"in_features, num_layers and low_rank must be positive, got {in_features}, "
                             f"{num_layers}, {low_rank}")
        self.in_features, self.num_layers, self.low_rank, self.fused = in_features, num_layers, low_rank, fused
        self.V = nn.ParameterList([nn.Parameter(torch.empty(low_rank, in_features)) for _ in range(num_layers)])
        self.W = nn.ParameterList([nn.Parameter(torch.empty(in_features, low_rank)) for _ in range(num_layers)])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(in_features)) for _ in range(num_layers)])
        std = (2.0 / (in_features + low_rank)) ** 0.5  # Xavier-normal, gain 1
        for v, w in zip(self.V, self.W):
            seeded_fill_(v, generator, lambda u: u.normal_(0.0, std, generator=generator))
            seeded_fill_(w, generator, lambda u: u.normal_(0.0, std, generator=generator))

    def forward(self, x0: Tensor) -> Tensor:
        """x0 (B, N) -> (B, N)"""
        if x0.dim() != 2 or x0.shape[1] != self.in_features:
            raise ValueError(f"x0 must be (B, {self.in_features}), got {tuple(x0.shape)}")
        if self.fused:
            device = x0.device.type
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                with torch.autocast(device, enabled=False):
                    return self._fused(x0.to(dtype), dtype)
            return self._fused(x0, x0.dtype)
        x = x0
        for v, w, b in zip(self.V, self.W, self.bias):
            x = torch.addcmul(x, x0, torch.nn.functional.linear(torch.nn.functional.linear(x, v), w, b))
        return x

    def _fused(self, x0: Tensor, dtype: torch.dtype) -> Tensor:
        """x0 (B, N) in ``dtype`` -> (B, N): :func:`dcn_cross_net` over the layers' weights, cast to ``dtype`` and
        stacked."""
        return dcn_cross_net(x0, *(torch.stack([p.to(dtype) for p in params])
                                   for params in (self.W, self.bias, self.V)))


class DCNInteraction(nn.Module):
    """DCNv2 interaction: dense ``(B, D)``, emb ``(B, F, D)`` -> ``(B, (F + 1) * D)`` (``out_features``). ``fused``
    (the fuselab kernel path): each cross layer is one :func:`fuselab.ops.gemm.dcn_cross` (:class:`LowRankCrossNet`);
    otherwise PyTorch ops. The cross layers' initial values come from ``generator``.

    Raises ``ValueError`` when the dense width differs from D, or in :meth:`forward` when the shapes do not match F
    and D."""

    config_class = DCNConfig

    def __init__(self, config: DCNConfig, *, num_sparse: int, dim: int, dense_dim: int, fused: bool = False,
                 generator: torch.Generator | None = None):
        super().__init__()
        config.check_widths(dense_dim, dim)
        self.num_sparse, self.dim = num_sparse, dim
        self.out_features = (num_sparse + 1) * dim
        self.crossnet = LowRankCrossNet(self.out_features, config.layers, config.low_rank, generator, fused=fused)

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """dense (B, D), emb (B, F, D) -> (B, (F + 1) * D)"""
        b = dense.shape[0]
        if dense.shape != (b, self.dim) or emb.shape != (b, self.num_sparse, self.dim):
            raise ValueError(f"dense must be (B, {self.dim}) and emb (B, {self.num_sparse}, {self.dim}), got "
                             f"{tuple(dense.shape)} and {tuple(emb.shape)}")
        x0 = torch.cat([dense.unsqueeze(1), emb.to(dense.dtype)], dim=1).reshape(b, self.out_features)
        return self.crossnet(x0)
