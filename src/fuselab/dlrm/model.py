"""The DLRM, composed from parts as torchrec composes it: ``DLRM(sparse_arch, dense_arch, interaction_arch,
over_arch)``; :meth:`DLRM.from_config` builds the parts of a config (the one place that reads the config's choices).

Shapes: ``B`` batch, ``F`` sparse features (26 for Criteo), ``D`` embedding dim, ``I = 13`` dense features, ``S`` ids
per sample of fixed-size bags, ``D_dense`` the dense arch's output width.

Parts (each keeps one ``state_dict`` whatever implements it):

* sparse arch (:mod:`fuselab.dlrm.sparse`): sparse ``(B, F)`` (fixed bags: ``(B, S)``) -> ``(B, F, D)``, the tables'
  optimizer applied in its backward;
* dense arch (:class:`DenseArch`): bottom MLP ``(B, I)`` -> ``(B, D_dense)``;
* interaction arch (:mod:`fuselab.dlrm.interaction`): ``(B, D_dense)``, ``(B, F, D)`` -> ``(B, out_features)``;
* over arch (:class:`OverArch`): top MLP -> ``(B, 1)`` logits.

``kernels`` picks the implementations of the same parts: ``"torch"`` (the reference:
:class:`~fuselab.dlrm.sparse.TorchEmbeddingCollection`, ``bmm`` + gather dot interaction, ``F.linear`` MLP layers)
or ``"fuselab"`` (:class:`~fuselab.dlrm.sparse.FusedEmbeddingCollection`, the fused dot interaction, MLP layers with
cuBLASLt's bias+ReLU epilogue; ``mlp=`` picks another :class:`~fuselab.nn.mlp.LinearAct` implementation). Both draw
the same initial values (one generator seeded by the config, in the order dense, sparse, interaction, over), so they
start from the same function, and each loads the other's ``state_dict``. The sigmoid is not part of the model: the
loss is BCE with logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fuselab.core.compile import compile_quietly
from fuselab.nn.mlp import INPUT_ALIGN, mlp_layers

from .config import KERNELS, NUM_DENSE, DLRMConfig
from .interaction import Interaction, build_interaction
from .sparse import FusedEmbeddingCollection, TableSpec, TorchEmbeddingCollection

__all__ = ["DLRM", "KERNELS", "DenseArch", "OverArch"]


class DenseArch(nn.Module):
    """Bottom MLP: dense ``(B, I)`` -> ``(B, widths[-1])``, ReLU after every layer (as both reference models).

    The first layer's input is padded to a multiple of :data:`~fuselab.nn.mlp.INPUT_ALIGN` (13 -> 16: zero weights
    that stay zero; the fused layers compute on 16-byte bf16 rows, the torch one skips the pad). ``impl``: the
    :class:`~fuselab.nn.mlp.LinearAct` implementation."""

    def __init__(self, in_features: int, widths: Sequence[int], *, impl: str = "torch",
                 generator: torch.Generator | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, int(widths[-1])
        self.mlp = mlp_layers([in_features, *widths], relu_last=True, impl=impl, in_pad=-in_features % INPUT_ALIGN,
                              generator=generator)

    def forward(self, dense: Tensor) -> Tensor:
        """dense (B, I) float -> (B, widths[-1])"""
        return self.mlp(dense)


class OverArch(nn.Module):
    """Top MLP: ``(B, in)`` -> ``(B, widths[-1])`` logits (``widths[-1] = 1``), ReLU between layers, none after the
    last. The first layer's input is padded to a multiple of :data:`~fuselab.nn.mlp.INPUT_ALIGN` (zero weights that
    stay zero): it takes the interaction's output unpadded or already padded (the fused dot interaction's)."""

    def __init__(self, in_features: int, widths: Sequence[int], *, impl: str = "torch",
                 generator: torch.Generator | None = None):
        super().__init__()
        self.in_features = in_features
        self.mlp = mlp_layers([in_features, *widths], relu_last=False, impl=impl, in_pad=-in_features % INPUT_ALIGN,
                              generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, in) or (B, in + pad) -> (B, widths[-1])"""
        return self.mlp(x)


class DLRM(nn.Module):
    """DLRM: ``forward(dense (B, 13), sparse (B, F) | (B, S)) -> logits (B,)`` (sigmoid at prediction).

    ``sparse_arch`` None: a model of the dense parts alone (its tables live elsewhere, e.g. sharded over ranks by
    :mod:`fuselab.dlrm.distributed`; only :meth:`dense_forward` works). Raises ValueError when the over arch does
    not take the interaction's width.
    """

    def __init__(self, sparse_arch: nn.Module | None, dense_arch: DenseArch, interaction_arch: Interaction,
                 over_arch: OverArch):
        super().__init__()
        if over_arch.in_features != interaction_arch.out_features:
            raise ValueError(f"the over arch takes {over_arch.in_features} features, the interaction gives "
                             f"{interaction_arch.out_features}")
        self.sparse_arch, self.dense_arch = sparse_arch, dense_arch
        self.interaction_arch, self.over_arch = interaction_arch, over_arch
        self._dense_part = self.dense_forward

    @classmethod
    def from_config(cls, cfg: DLRMConfig, table_sizes: Sequence[int], *, kernels: str | None = None,
                    mlp: str | None = None, embeddings: bool = True) -> DLRM:
        """The model of ``cfg`` over tables of ``table_sizes`` rows: its architecture, ``seed`` (initial values),
        tables' optimizer (``cfg.embedding_optimizer``, ``lr_sparse``), pooling and bags, implemented by ``kernels``
        (``"torch"`` or ``"fuselab"``; None: the config's, which must then be resolved: the trainer resolves
        ``"auto"`` for its device; module docstring); ``mlp``
        another :data:`~fuselab.nn.mlp.MLP_IMPLS` (default ``"addmm"`` with fuselab, ``"torch"`` with torch);
        ``embeddings=False``: no tables (``sparse_arch`` None; the over arch's initial values then differ from a
        model with tables, whose initialisation draws the tables in between). Raises ValueError for an unknown
        ``kernels`` or ``mlp``, and widths that do not fit the interaction."""
        kernels = cfg.kernels if kernels is None else kernels
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS} (the trainer resolves 'auto'), got {kernels!r}")
        fused = kernels == "fuselab"
        impl = mlp or ("addmm" if fused else "torch")
        gen = torch.Generator().manual_seed(cfg.seed)
        dense_arch = DenseArch(NUM_DENSE, cfg.bottom_mlp, impl=impl, generator=gen)
        sparse_arch = None
        if embeddings:
            bags = None if cfg.multi_hot_sizes is None else tuple(cfg.multi_hot_sizes)
            spec = TableSpec(tuple(table_sizes), cfg.embedding_dim, cfg.pooling, bags, cfg.embedding_dtype)
            options = dict(optimizer=cfg.embedding_optimizer, lr=cfg.lr_sparse, generator=gen)
            sparse_arch = (FusedEmbeddingCollection(spec, **options) if fused else
                           TorchEmbeddingCollection(spec, sparse_grad=cfg.sparse_grad, **options))
        interaction_arch = build_interaction(cfg.interaction, num_sparse=len(table_sizes), dim=cfg.embedding_dim,
                                             dense_dim=dense_arch.out_features, fused=fused, generator=gen)
        over_arch = OverArch(interaction_arch.out_features, cfg.top_mlp, impl=impl, generator=gen)
        return cls(sparse_arch, dense_arch, interaction_arch, over_arch)

    @property
    def optimizer(self):
        """The tables' :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer` (None without tables)."""
        return None if self.sparse_arch is None else self.sparse_arch.optimizer

    def dense_forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """Everything but the embedding lookup: dense (B, 13), emb (B, F, D) -> logits (B,)."""
        return self.top_forward(self.bottom_forward(dense), emb)

    def bottom_forward(self, dense: Tensor) -> Tensor:
        """The dense arch alone: dense (B, 13) -> (B, D_dense) (runs while the lookup does: :mod:`.overlap`)."""
        return self.dense_arch(dense)

    def top_forward(self, x: Tensor, emb: Tensor) -> Tensor:
        """The interaction and the over arch: x (B, D_dense), emb (B, F, D) -> logits (B,)."""
        return self.over_arch(self.interaction_arch(x, emb)).squeeze(1)

    def compile_dense(self, **kwargs) -> None:
        """``torch.compile`` the MLPs and the interaction (the lookup stays eager)."""
        self._dense_part = compile_quietly(self.dense_forward, **kwargs)

    def sparse_forward(self, sparse: Tensor) -> Tensor:
        """The lookup: sparse (B, F) int64 (fixed bags: (B, S)) -> pooled embeddings (B, F, D)."""
        return self.sparse_arch(sparse)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        """dense (B, 13) float, sparse (B, F) int64 (fixed bags: (B, S)) -> logits (B,)"""
        return self._dense_part(dense, self.sparse_forward(sparse))

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the tables' (the MLPs', the interaction's): what the dense optimizer updates."""
        return [p for n, p in self.named_parameters() if not n.startswith("sparse_arch.")]
