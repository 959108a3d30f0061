"""The DLRM model: DenseArch -> SparseArch -> InteractionArch -> OverArch.

Shapes: ``B`` batch, ``F`` sparse features (26 for Criteo), ``D`` embedding dim, ``I = 13`` dense features.

Dot interaction pair order
--------------------------
The F+1 vectors are ``v_0 = dense_arch(dense)`` and ``v_1..v_F`` the F embeddings. The dot interaction keeps the
*strict lower triangle* of the Gram matrix ``Z = V Vᵀ`` in row-major order, i.e. the pairs

    (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), ..., (F,F-1)

so pair ``(i, j)`` with ``j < i`` sits at flat index ``i(i-1)/2 + j`` (with self-interaction the diagonal is
included: pairs ``(i, j)``, ``j <= i``, at index ``i(i+1)/2 + j``). This is facebookresearch/dlrm's order.
torchrec keeps the *upper* triangle row-major, ``(0,1), (0,2), ..., (0,F), (1,2), ...``; the same dot products in
another order. :func:`torchrec_permutation` gives the index map: ``ours[:, perm] == torchrec's``.

Two kernel paths (``DLRM(kernels=...)``)
----------------------------------------
* ``"torch"``, the reference: :class:`SparseArch` (``F.embedding``, sparse COO gradients updated by
  :class:`fuselab.dlrm.optim.Optimizers`), ``bmm`` + gather interaction, ``nn.Linear`` + ``nn.ReLU``.
* ``"fuselab"``: the sparse arch is :class:`fuselab.ops.embedding.EmbeddingBagCollection` (its backward applies
  the optimizer update in place: no embedding gradient exists), the interaction is
  :func:`fuselab.ops.interaction.dot_interaction` zero-padded to a multiple of ``pad_to`` columns (367 -> 368 for
  Kaggle: the first top layer gets ``in_features`` = padded width, its pad columns start at zero and, as their
  inputs are always zero, get zero gradient and stay zero), and :class:`LinearAct` layers with bias and ReLU
  fused (``mlp="addmm"``: cuBLASLt's epilogue; ``"fused_linear"``: :func:`fuselab.nn.fused_linear`).
  Both paths draw the same initial values (same generator, same order), so they start from the same function.
The sigmoid is not part of the model: the loss is BCE with logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.core.compile import compile_quietly
from fuselab.core.embedding_optimizer import embedding_optimizer
from fuselab.core.seeded import seeded_fill_, uniform_tables_
from fuselab.nn import fused_linear

from .bags import FixedBags, check_sizes
from .config import NUM_DENSE, DLRMConfig
from .interaction import InteractionArch, pair_indices, torchrec_permutation

__all__ = ["DLRM", "KERNELS", "MLP_IMPLS", "DenseArch", "InteractionArch", "LinearAct", "OverArch", "SparseArch",
           "pair_indices", "torchrec_permutation"]

KERNELS = ("torch", "fuselab")
#: LinearAct implementations: F.linear + relu, cuBLASLt's bias+ReLU epilogue, fuselab's Triton epilogue
MLP_IMPLS = ("torch", "addmm", "fused_linear")
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


def _init_values(fan_in: int, fan_out: int, gen: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """facebookresearch/dlrm's initialisation: W ~ N(0, sqrt(2/(fan_in+fan_out))) [out, in], b ~ N(0, sqrt(1/out))."""
    weight, bias = torch.empty(fan_out, fan_in), torch.empty(fan_out)  # on the default device
    seeded_fill_(weight, gen, lambda t: t.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=gen))
    seeded_fill_(bias, gen, lambda t: t.normal_(0.0, math.sqrt(1.0 / fan_out), generator=gen))
    return weight, bias


def _init_linear(layer: nn.Linear, gen: torch.Generator | None) -> None:
    weight, bias = _init_values(layer.in_features, layer.out_features, gen)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)


class _AddmmReLU(torch.autograd.Function):
    """``relu(x @ weight.T + bias)`` through ``torch._addmm_activation`` (cuBLASLt's bias+ReLU epilogue on CUDA,
    which has no autograd formula): backward ``dz = grad * (y > 0)``, ``dx = dz W``, ``dW = dzᵀ x``, ``db = Σ dz``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        y = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight if ctx.needs_input_grad[0] else None, y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight, y = ctx.saved_tensors
        dz = torch.ops.aten.threshold_backward(grad, y, 0)  # nn.ReLU's backward: grad where y > 0
        want_x, want_w, want_b = ctx.needs_input_grad
        return (dz.mm(weight) if want_x else None, dz.t().mm(x) if want_w else None,
                dz.sum(0) if want_b else None)


class LinearAct(nn.Module):
    """``y = act(x @ W.T + b)``, act ReLU or none: x [B, in] -> [B, out] (fuselab path's MLP layer).

    ``impl``: ``"torch"`` (``F.linear`` + ``F.relu``), ``"addmm"`` (``torch._addmm_activation``: cuBLASLt's bias+ReLU
    epilogue; ``torch.addmm`` without activation), ``"fused_linear"`` (:func:`fuselab.nn.fused_linear`: cuBLAS
    matmul + Triton epilogue). Under autocast the fused implementations cast x, W, b to the autocast dtype
    themselves (as autocast does for ``nn.Linear``) and run with autocast off, so they take their fast paths.
    ``in_pad`` extra zero input columns: the layer's weight is [out, in + in_pad], its pad columns zero.
    """

    def __init__(self, in_features: int, out_features: int, relu: bool, impl: str = "addmm", in_pad: int = 0,
                 generator: torch.Generator | None = None):
        super().__init__()
        if impl not in MLP_IMPLS:
            raise ValueError(f"mlp must be one of {MLP_IMPLS}, got {impl!r}")
        self.in_features, self.out_features, self.relu, self.impl = in_features + in_pad, out_features, relu, impl
        self.in_pad = in_pad
        weight, bias = _init_values(in_features, out_features, generator)
        self.weight = nn.Parameter(F.pad(weight, (0, in_pad)))
        self.bias = nn.Parameter(bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.impl == "torch":
            y = F.linear(x, self.weight, self.bias)
            return F.relu(y) if self.relu else y
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            with torch.autocast(device, enabled=False):
                return self._fused(x.to(dtype), self.weight.to(dtype), self.bias.to(dtype))
        return self._fused(x, self.weight, self.bias)

    def _fused(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        if self.impl == "fused_linear":
            return fused_linear(x, weight, bias, "relu" if self.relu else "none")
        return _AddmmReLU.apply(x, weight, bias) if self.relu else torch.addmm(bias, x, weight.t())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, relu={self.relu}, impl={self.impl!r}"


def _mlp(widths: Sequence[int], relu_last: bool, gen: torch.Generator | None, impl: str = "torch",
         in_pad: int = 0) -> nn.Sequential:
    """``impl="torch"``: nn.Linear and nn.ReLU modules (the reference); else :class:`LinearAct` layers."""
    layers: list[nn.Module] = []
    for k in range(len(widths) - 1):
        relu = k < len(widths) - 2 or relu_last
        if impl == "torch":
            if in_pad:
                raise ValueError("in_pad needs a fused MLP implementation")
            linear = nn.Linear(widths[k], widths[k + 1])
            _init_linear(linear, gen)
            layers.extend([linear, nn.ReLU()] if relu else [linear])
        else:
            layers.append(LinearAct(widths[k], widths[k + 1], relu, impl, in_pad if k == 0 else 0, gen))
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP: [B, I] -> [B, widths[-1]], ReLU after every layer (as both reference models).
    ``mlp``: one of :data:`MLP_IMPLS` (``"torch"``: nn.Linear + nn.ReLU modules). ``in_pad`` zero columns are
    appended to the input (fused MLPs only: 13 -> 16 keeps the first GEMM's rows 16-byte aligned in bf16); the
    first layer's weights for them start at zero and get zero gradient."""

    def __init__(self, in_features: int, widths: Sequence[int], generator: torch.Generator | None = None,
                 mlp: str = "torch", in_pad: int = 0):
        super().__init__()
        self.out_features = int(widths[-1])
        self.in_pad = in_pad
        self.mlp = _mlp([in_features, *widths], relu_last=True, gen=generator, impl=mlp, in_pad=in_pad)

    def forward(self, dense: Tensor) -> Tensor:
        """dense [B, I] float -> [B, widths[-1]]"""
        return self.mlp(F.pad(dense, (0, self.in_pad)) if self.in_pad else dense)


class SparseArch(nn.Module):
    """One embedding table per sparse feature: ids [B, F] int64 (already hashed into each table) -> [B, F, D].

    ``layout="fused"`` stores the F tables as row ranges of one weight (one lookup kernel per step);
    ``layout="per_table"`` is one ``nn.EmbeddingBag(mode="sum")`` per feature (bags of one id). Both
    initialise table ``t`` with U(-1/sqrt(rows_t), 1/sqrt(rows_t)) and give ``sparse=True`` gradients when
    ``sparse_grad`` (SGD and Adagrad handle them; only the looked-up rows are touched). ``multi_hot_sizes``
    (``layout="fused"`` only): fixed-size bags, ids [B, S] (see :mod:`fuselab.dlrm.bags`), pooled by ``pooling``
    (``sum`` or ``mean``) as one product with a (F, S) matrix of 0/1 (or 1/size): plain ops that ONNX exports.
    """

    def __init__(self, table_sizes: Sequence[int], dim: int, layout: str = "fused", sparse_grad: bool = True,
                 generator: torch.Generator | None = None, pooling: str = "sum",
                 multi_hot_sizes: Sequence[int] | None = None):
        super().__init__()
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        if multi_hot_sizes is not None and layout != "fused":
            raise ValueError("multi_hot_sizes needs layout='fused'")
        self.register_buffer("pool", None, persistent=False)  # (F, S) with multi_hot_sizes
        if not table_sizes or any(int(n) <= 0 for n in table_sizes):
            raise ValueError(f"table_sizes must be positive row counts, got {list(table_sizes)[:8]}...")
        self.table_sizes = [int(n) for n in table_sizes]
        self.dim = int(dim)
        self.layout = layout
        if layout == "fused":
            offsets = torch.tensor([0, *self.table_sizes], dtype=torch.int64).cumsum(0)
            self.register_buffer("offsets", offsets[:-1].clone(), persistent=False)
            self.weight = nn.Parameter(torch.empty(sum(self.table_sizes), dim))
            if multi_hot_sizes is not None:
                bags = torch.tensor(check_sizes(multi_hot_sizes, len(self.table_sizes)))
                table = torch.arange(len(self.table_sizes)).repeat_interleave(bags)  # table of each column
                pool = (table[None, :] == torch.arange(len(self.table_sizes))[:, None]).float()
                self.register_buffer("pool", pool / bags[:, None] if pooling == "mean" else pool, persistent=False)
                self.register_buffer("column_offsets", offsets[table], persistent=False)
            uniform_tables_(self.weight, self.table_sizes, generator)
            self.sparse_grad = sparse_grad
        elif layout == "per_table":
            self.tables = nn.ModuleList()
            for n in self.table_sizes:
                bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse_grad)
                uniform_tables_(bag.weight, [n], generator)
                self.tables.append(bag)
        else:
            raise ValueError(f"layout must be 'fused' or 'per_table', got {layout!r}")

    @property
    def num_features(self) -> int:
        return len(self.table_sizes)

    def forward(self, ids: Tensor) -> Tensor:
        """ids [B, F] int64, ``0 <= ids[:, t] < table_sizes[t]`` -> [B, F, D]; with ``multi_hot_sizes``: ids
        [B, S], each table's bag in its columns -> [B, F, D] pooled"""
        if self.pool is not None:
            emb = nn.functional.embedding(ids + self.column_offsets, self.weight, sparse=self.sparse_grad)
            return torch.matmul(self.pool, emb)  # (F, S) @ (B, S, D): each table's columns summed / averaged
        if self.layout == "fused":
            rows = ids + self.offsets
            return nn.functional.embedding(rows, self.weight, sparse=self.sparse_grad)
        return torch.stack([bag(ids[:, t: t + 1]) for t, bag in enumerate(self.tables)], dim=1)


class OverArch(nn.Module):
    """Top MLP: [B, in + in_pad] -> [B, 1] logit (ReLU between layers, none after the last). The first layer's
    ``in_pad`` extra input columns (zero-padded interaction output) have zero weights at initialisation."""

    def __init__(self, in_features: int, widths: Sequence[int], generator: torch.Generator | None = None,
                 mlp: str = "torch", in_pad: int = 0):
        super().__init__()
        self.mlp = _mlp([in_features, *widths], relu_last=False, gen=generator, impl=mlp, in_pad=in_pad)

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(x)


def _fuselab_ops() -> tuple[type, object]:
    """fuselab's EmbeddingBagCollection and dot_interaction; ImportError naming them when not built in."""
    try:
        from fuselab.ops.embedding import EmbeddingBagCollection
        from fuselab.ops.interaction import dot_interaction
    except ImportError as exc:
        raise ImportError(f"kernels='fuselab' needs fuselab.ops.embedding and fuselab.ops.interaction: {exc}") from exc
    return EmbeddingBagCollection, dot_interaction


class DLRM(nn.Module):
    """DLRM: ``forward(dense [B, 13], sparse [B, F] table-row ids) -> logits [B]`` (sigmoid at prediction).

    ``kernels="torch"`` (the reference; ``sparse`` must already be hashed into each table, see
    :class:`fuselab.dlrm.data.loader.Hasher`) or ``"fuselab"`` (the fused embedding collection applies
    ``id % rows`` itself; ``optimizer``, ``lr_sparse``, ``adagrad_eps``, ``deterministic`` configure its fused
    update; ``pad_to`` pads the interaction output and, with fused MLPs, the dense input; ``mlp`` picks the
    :class:`LinearAct` implementation, default ``"addmm"``). ``embeddings=False`` builds no tables
    (``sparse_arch`` is None: they live elsewhere, e.g. sharded over ranks by :mod:`fuselab.dlrm.distributed`; only
    :meth:`dense_forward` works; the top MLP's initial values then differ from a model with tables, whose
    initialisation draws the tables in between). ``multi_hot_sizes``: fixed-size bags (``sparse`` is then (B, S),
    ``S = sum(multi_hot_sizes)``, see :mod:`fuselab.dlrm.bags`) pooled by ``pooling``; ``interaction="dcn"`` with
    ``dcn_num_layers``/``dcn_low_rank`` is MLPerf's DLRM-DCNv2. The torch path's embedding optimizer lives in
    :class:`fuselab.dlrm.optim.Optimizers` (``optimizer`` etc. are only recorded). Build from a config with
    :meth:`from_config`; the seed makes initialisation reproducible and equal across the two paths.
    Raises ValueError for an unknown kernels/optimizer/mlp or a ``pad_to`` below 1, ImportError when
    ``kernels="fuselab"`` and fuselab's embedding/interaction ops are missing.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, bottom_mlp: Sequence[int],
                 top_mlp: Sequence[int], interaction: str = "dot", self_interaction: bool = False,
                 embedding_layout: str = "fused", sparse_grad: bool = True, seed: int = 0, *,
                 kernels: str = "torch", optimizer: str = "adagrad", lr_sparse: float = 0.05,
                 adagrad_eps: float = 1e-8, mlp: str | None = None, pad_to: int = 8, deterministic: bool = True,
                 embeddings: bool = True, multi_hot_sizes: Sequence[int] | None = None, pooling: str = "sum",
                 dcn_num_layers: int = 3, dcn_low_rank: int = 512):
        super().__init__()
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        fused = kernels == "fuselab"
        mlp = mlp or ("addmm" if fused else "torch")
        if mlp not in MLP_IMPLS:
            raise ValueError(f"mlp must be one of {MLP_IMPLS}, got {mlp!r}")
        if not isinstance(pad_to, int) or pad_to < 1:
            raise ValueError(f"pad_to must be a positive int, got {pad_to!r}")
        self.kernels, self.optimizer, self.adagrad_eps, self.mlp_impl = kernels, optimizer, adagrad_eps, mlp
        gen = torch.Generator().manual_seed(seed)
        dense_pad = -NUM_DENSE % pad_to if fused and mlp != "torch" else 0
        self.dense_arch = DenseArch(NUM_DENSE, bottom_mlp, gen, mlp, dense_pad)
        self.sparse_arch: nn.Module | None = None
        if fused:
            collection, dot_fn = _fuselab_ops()
            if embeddings:
                self.sparse_arch = collection(list(table_sizes), embedding_dim,
                                              optimizer=embedding_optimizer(optimizer, eps=adagrad_eps),
                                              lr=lr_sparse, deterministic=deterministic, generator=gen,
                                              pooling=pooling)
        else:
            dot_fn, pad_to = None, 1
            if embeddings:
                self.sparse_arch = SparseArch(table_sizes, embedding_dim, embedding_layout, sparse_grad, gen, pooling,
                                              multi_hot_sizes)
        # the fused collection takes fixed-size bags as (ids, offsets); SparseArch pools them itself
        self.bags = FixedBags(check_sizes(multi_hot_sizes, len(table_sizes))) if multi_hot_sizes and fused else None
        if interaction != "dot":
            pad_to = 1
        self.interaction_arch = InteractionArch(len(table_sizes), embedding_dim, interaction, self_interaction,
                                                dense_dim=self.dense_arch.out_features, dot_fn=dot_fn, pad_to=pad_to,
                                                dcn_num_layers=dcn_num_layers, dcn_low_rank=dcn_low_rank,
                                                generator=gen)
        inter = self.interaction_arch
        self.over_arch = OverArch(inter.width, top_mlp, gen, mlp, in_pad=inter.out_features - inter.width)
        self._dense_part = self.dense_forward

    @classmethod
    def from_config(cls, cfg: DLRMConfig, table_sizes: Sequence[int], **overrides) -> DLRM:
        """The model of ``cfg``: its architecture, ``seed``, ``kernels`` ("torch" or "fuselab"; the trainer
        resolves "auto"), ``optimizer``, ``lr_sparse``, ``adagrad_eps`` (defaults where a config lacks them);
        ``overrides`` are passed to the constructor (e.g. ``mlp="fused_linear"``)."""
        defaults = {"kernels": "torch", "adagrad_eps": 1e-8, "multi_hot_sizes": None, "pooling": "sum",
                    "dcn_num_layers": 3, "dcn_low_rank": 512}
        options = {key: getattr(cfg, key, value) for key, value in defaults.items()}
        options.update(optimizer=cfg.optimizer, lr_sparse=cfg.lr_sparse)
        options.update(overrides)
        return cls(table_sizes, cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp, cfg.interaction,
                   cfg.self_interaction, getattr(cfg, "embedding_layout", "fused"), getattr(cfg, "sparse_grad", True),
                   cfg.seed, **options)

    def dense_forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """Everything but the embedding lookup: dense [B, 13], emb [B, F, D] -> logits [B]."""
        x = self.dense_arch(dense)
        return self.over_arch(self.interaction_arch(x, emb)).squeeze(1)

    def compile_dense(self, **kwargs) -> None:
        """``torch.compile`` the MLPs and the interaction (the lookup stays eager: sparse gradients)."""
        self._dense_part = compile_quietly(self.dense_forward, **kwargs)

    def sparse_forward(self, sparse: Tensor) -> Tensor:
        """The lookup: sparse [B, F] int64 (multi-hot: [B, S]) -> pooled embeddings [B, F, D]."""
        if self.bags is not None:
            return self.sparse_arch(*self.bags(sparse))
        return self.sparse_arch(sparse)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        """dense [B, 13] float, sparse [B, F] int64 (multi-hot: [B, S]) -> logits [B]"""
        return self._dense_part(dense, self.sparse_forward(sparse))

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.sparse_arch.parameters())

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if not n.startswith("sparse_arch.")]
