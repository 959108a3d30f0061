"""The DLRM a training-step benchmark runs, described without any implementation: shape, weights, cost, reference.

Every provider of the DLRM suite (``fuselab.bench.suites.dlrm``) builds its own model of one :class:`DLRMShape` and
loads the same :class:`DLRMWeights` into it, so that their first-step losses can be compared with one float64
reference (:func:`reference_loss`), computed here from the shape and the weights alone.

Notation: ``B`` batch, ``F`` tables (sparse features), ``D`` embedding dim, ``S`` ids per sample (``F`` with one id
per table, the sum of the bag sizes with fixed multi-hot bags: table ``f``'s bag in columns
``[prefix_f, prefix_f + bag_f)`` of the ``(B, S)`` ids), ``N = (F + 1)·D`` the width of the cross layers.

The model: bottom MLP (13 dense inputs, ReLU after every layer, last width ``D``); the pooled embeddings (the sum of
each bag); the interaction: ``dot`` (the dense vector and the F embeddings, the strict lower triangle of their Gram
matrix in row-major order, ``(1,0), (2,0), (2,1), ...``, after the dense vector) or ``dcn`` (low-rank cross layers
``x_{l+1} = x_0 ⊙ (W_l (V_l x_l) + b_l) + x_l`` over ``x_0 = [dense, emb_1, ..., emb_F]``); top MLP (ReLU between
layers, a logit at the end); BCE with logits.

Table values are not drawn from a generator: row ``r`` of the tables (rows numbered across the tables, table after
table) holds a hash of ``(seed, r, column)`` scaled to ``±1/sqrt(rows of its table)`` (:meth:`DLRMWeights.rows`), so
any provider fills any table, of any size, on its device, and the reference computes just the rows a batch looks up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

NUM_DENSE = 13
INTERACTIONS = ("dot", "dcn")
_MASK31 = (1 << 31) - 1
_MIX = 0x45D9F3B  # an odd multiplier below 2**27: products of 31-bit values stay below 2**58
_ROWS_PER_FILL = 1 << 16  # rows hashed per chunk when a table is filled


@dataclass(frozen=True)
class DLRMShape:
    """A DLRM's architecture (see the module docstring). Raises ``ValueError`` naming the field that is wrong."""

    table_sizes: tuple[int, ...]
    dim: int
    bottom: tuple[int, ...]  # widths after the 13 dense inputs; the last is ``dim``
    top: tuple[int, ...]  # widths after the interaction; the last is 1
    interaction: str = "dot"
    cross_layers: int = 0  # dcn only
    cross_rank: int = 0  # dcn only
    bag_sizes: tuple[int, ...] | None = None  # ids per sample of each table; None: one

    def __post_init__(self) -> None:
        if not self.table_sizes or min(self.table_sizes) < 1:
            raise ValueError(f"table_sizes must be positive row counts, got {self.table_sizes[:8]}")
        if self.dim < 1 or not self.bottom or self.bottom[-1] != self.dim or min(self.bottom) < 1:
            raise ValueError(f"bottom must be positive widths ending at dim={self.dim}, got {self.bottom}")
        if not self.top or self.top[-1] != 1 or min(self.top) < 1:
            raise ValueError(f"top must be positive widths ending in 1, got {self.top}")
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"interaction must be one of {INTERACTIONS}, got {self.interaction!r}")
        if self.interaction == "dcn" and min(self.cross_layers, self.cross_rank) < 1:
            raise ValueError(f"dcn needs cross_layers and cross_rank >= 1, got {self.cross_layers}, {self.cross_rank}")
        if self.bag_sizes is not None and (len(self.bag_sizes) != len(self.table_sizes) or min(self.bag_sizes) < 1):
            raise ValueError(f"bag_sizes must be {len(self.table_sizes)} positive ints, got {self.bag_sizes[:8]}")

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def bags(self) -> tuple[int, ...]:
        """Ids per sample of each table."""
        return self.bag_sizes or (1,) * self.num_tables

    @property
    def ids_per_sample(self) -> int:
        return sum(self.bags)

    @property
    def rows(self) -> int:
        return sum(self.table_sizes)

    @property
    def table_offsets(self) -> tuple[int, ...]:
        """First row of each table in the rows numbered across the tables."""
        return tuple(int(x) for x in torch.tensor((0, *self.table_sizes[:-1])).cumsum(0))

    @property
    def column_tables(self) -> tuple[int, ...]:
        """The table of each of the ``S`` id columns."""
        return tuple(t for t, n in enumerate(self.bags) for _ in range(n))

    @property
    def interaction_width(self) -> int:
        """Width of the interaction's output, the top MLP's input."""
        vectors = self.num_tables + 1
        if self.interaction == "dot":
            return self.dim + vectors * (vectors - 1) // 2
        return vectors * self.dim

    def mlp_layers(self) -> list[tuple[int, int]]:
        """(in, out) of every MLP layer, bottom then top."""
        widths = [NUM_DENSE, *self.bottom]
        top = [self.interaction_width, *self.top]
        return [*itertools.pairwise(widths), *itertools.pairwise(top)]

    def dense_parameters(self) -> int:
        """Parameters outside the tables (MLPs and cross layers)."""
        n = (self.num_tables + 1) * self.dim
        cross = self.cross_layers * (2 * n * self.cross_rank + n) if self.interaction == "dcn" else 0
        return sum(i * o + o for i, o in self.mlp_layers()) + cross

    def forward_flops(self) -> int:
        """Flops of one sample's forward: the MLPs' and cross layers' products (2 per multiply-add), the dot
        interaction's pairs, the bags' sums; element-wise work (activations, the cross layers' products with x_0)
        is not counted."""
        flops = 2 * sum(i * o for i, o in self.mlp_layers())
        vectors = self.num_tables + 1
        if self.interaction == "dot":
            flops += 2 * self.dim * vectors * (vectors - 1) // 2
        else:
            flops += self.cross_layers * 4 * vectors * self.dim * self.cross_rank
        return flops + (self.ids_per_sample - self.num_tables) * self.dim

    def train_flops(self) -> int:
        """Flops of one sample's training step: the forward, and twice it for the backward (the gradients of the
        inputs and of the weights of every product)."""
        return 3 * self.forward_flops()

    def step_bytes(self, batch: int, unique_rows: int, table_bytes: int = 4, state_bytes: int = 4) -> int:
        """The least a training step moves: the batch read once (ids, dense features, labels), each distinct
        looked-up row read by the lookup, then it and its row-wise optimizer state read and written by the update,
        the dense parameters and their Adagrad state read and written once (fp32). Activations are not counted: a
        step that kept them on chip would not move them."""
        batch_bytes = batch * (8 * self.ids_per_sample + 4 * NUM_DENSE + 4)
        rows = unique_rows * (self.dim * table_bytes + 2 * (self.dim * table_bytes + state_bytes))
        return batch_bytes + rows + 4 * 4 * self.dense_parameters()


def _mix(x: Tensor) -> Tensor:
    """A bijective scramble of 31-bit values (int64 tensors in [0, 2**31))."""
    x = ((x >> 16) ^ x) * _MIX & _MASK31
    x = ((x >> 16) ^ x) * _MIX & _MASK31
    return (x >> 16) ^ x


@dataclass(frozen=True, eq=False)
class DLRMWeights:
    """The weights every provider starts from: ``bottom`` and ``top`` as ``(weight (out, in), bias (out,))`` per layer,
    ``cross`` as ``(V (r, N), W (N, r), bias (N,))`` per cross layer (fp32, CPU), the tables by :meth:`rows`."""

    shape: DLRMShape
    bottom: tuple[tuple[Tensor, Tensor], ...]
    top: tuple[tuple[Tensor, Tensor], ...]
    cross: tuple[tuple[Tensor, Tensor, Tensor], ...]
    seed: int = 0

    @cached_property
    def _bounds(self) -> Tensor:
        return torch.tensor([1.0 / math.sqrt(n) for n in self.shape.table_sizes], dtype=torch.float32)

    def rows(self, rows: Tensor, table: Tensor | int) -> Tensor:
        """fp32 ``(len(rows), D)`` initial values of the rows numbered across the tables (int64 ``rows``, table
        ``table`` of each, or one table for all), on ``rows``' device: U(±1/sqrt(rows of the table))-like hashes."""
        columns = torch.arange(self.shape.dim, device=rows.device, dtype=torch.int64)
        key = _mix((rows + self.seed * 1_000_003) & _MASK31)
        h = _mix(key[:, None] ^ columns[None, :])
        bound = self._bounds.to(rows.device)[table]
        bound = bound[:, None] if isinstance(table, Tensor) else bound
        return (h.to(torch.float32) * 2.0**-30 - 1.0) * bound

    @torch.no_grad()
    def fill_table_(self, weight: Tensor, table: int) -> Tensor:
        """Write table ``table``'s initial values into ``weight`` (``(rows of the table, D)``, any float dtype and
        device), a chunk of rows at a time; returns ``weight``."""
        first = self.shape.table_offsets[table]
        for start in range(0, weight.shape[0], _ROWS_PER_FILL):
            stop = min(weight.shape[0], start + _ROWS_PER_FILL)
            rows = torch.arange(first + start, first + stop, device=weight.device, dtype=torch.int64)
            weight[start:stop].copy_(self.rows(rows, table))
        return weight

    @torch.no_grad()
    def fill_tables_(self, weight: Tensor) -> Tensor:
        """The same for every table into one ``(rows of all tables, D)`` weight, table after table."""
        for t, (first, n) in enumerate(zip(self.shape.table_offsets, self.shape.table_sizes)):
            self.fill_table_(weight[first: first + n], t)
        return weight


def make_weights(shape: DLRMShape, seed: int = 0) -> DLRMWeights:
    """Seeded weights of ``shape``: MLP weights N(0, sqrt(2 / (in + out))) and biases N(0, sqrt(1 / out))
    (facebookresearch/dlrm's initialisation), cross layers' V and W Xavier-normal and small random biases."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*size: int, std: float) -> Tensor:
        return torch.randn(*size, generator=gen) * std

    layers = [(normal(o, i, std=math.sqrt(2.0 / (i + o))), normal(o, std=math.sqrt(1.0 / o)))
              for i, o in shape.mlp_layers()]
    cross = []
    if shape.interaction == "dcn":
        n, r = (shape.num_tables + 1) * shape.dim, shape.cross_rank
        std = math.sqrt(2.0 / (n + r))
        cross = [(normal(r, n, std=std), normal(n, r, std=std), normal(n, std=0.01)) for _ in range(shape.cross_layers)]
    split = len(shape.bottom)
    return DLRMWeights(shape, tuple(layers[:split]), tuple(layers[split:]), tuple(cross), seed)


class JaggedIds:
    """The ``(B, S)`` ids as table-batched embeddings take them (FBGEMM, TorchRec, an ``EmbeddingBag`` per table):
    the ids of each table in turn, each sample's bag contiguous (``values``), bag boundaries ``offsets`` (``F·B + 1``)
    and lengths; the index is built once per batch size on ``device``, then each batch is one gather."""

    def __init__(self, shape: DLRMShape, device: torch.device):
        self.shape, self.device = shape, device
        self._layout: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def layout(self, batch: int) -> tuple[Tensor, Tensor, Tensor]:
        """(gather index into the flat ids, offsets, lengths) for ``batch`` samples."""
        if batch not in self._layout:
            bags = torch.tensor(self.shape.bags, device=self.device)
            prefix = torch.cumsum(bags, 0) - bags
            width = self.shape.ids_per_sample
            index = [(torch.arange(batch, device=self.device)[:, None] * width + a
                      + torch.arange(n, device=self.device)[None, :]).reshape(-1) for a, n in
                     zip(prefix.tolist(), self.shape.bags)]
            lengths = bags.repeat_interleave(batch)
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
            self._layout[batch] = (torch.cat(index), offsets, lengths)
        return self._layout[batch]

    def __call__(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """ids ``(B, S)`` -> (values ``(B·S,)``, offsets ``(F·B + 1,)``, lengths ``(F·B,)``)."""
        index, offsets, lengths = self.layout(ids.shape[0])
        return ids.reshape(-1).index_select(0, index), offsets, lengths


def _mlp(x: Tensor, layers: Sequence[tuple[Tensor, Tensor]], relu_last: bool) -> Tensor:
    for k, (w, b) in enumerate(layers):
        x = F.linear(x, w, b)
        if relu_last or k < len(layers) - 1:
            x = torch.relu(x)
    return x


def pair_indices(vectors: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Row and column of each kept Gram-matrix entry: the strict lower triangle, row-major."""
    rows, cols = torch.tril_indices(vectors, vectors, offset=-1, device=device)
    return rows, cols


@torch.no_grad()
def reference_loss(weights: DLRMWeights, dense: Tensor, ids: Tensor, labels: Tensor, chunk: int = 4096) -> Tensor:
    """The batch's mean BCE-with-logits loss of the model at ``weights``, in float64 (0-dim, on ``ids``' device):
    dense ``(B, 13)``, ids ``(B, S)`` (each table's own row numbers), labels ``(B,)``; ``chunk`` samples at a time."""
    shape, device = weights.shape, ids.device
    f64 = dict(dtype=torch.float64, device=device)
    bottom = [(w.to(**f64), b.to(**f64)) for w, b in weights.bottom]
    top = [(w.to(**f64), b.to(**f64)) for w, b in weights.top]
    cross = [tuple(t.to(**f64) for t in layer) for layer in weights.cross]
    column_tables = torch.tensor(shape.column_tables, device=device)
    column_first = torch.tensor(shape.table_offsets, device=device)[column_tables]
    li, lj = pair_indices(shape.num_tables + 1, device)
    total = torch.zeros((), **f64)
    for start in range(0, ids.shape[0], chunk):
        rows = (ids[start: start + chunk].to(torch.int64) + column_first).reshape(-1)
        b = rows.numel() // shape.ids_per_sample
        values = weights.rows(rows, column_tables.repeat(b)).to(torch.float64).view(b, -1, shape.dim)
        emb = torch.zeros(b, shape.num_tables, shape.dim, **f64).index_add_(1, column_tables, values)
        x = _mlp(dense[start: start + chunk].to(torch.float64), bottom, relu_last=True)
        vectors = torch.cat([x[:, None], emb], dim=1)
        if shape.interaction == "dot":
            z = torch.cat([x, torch.bmm(vectors, vectors.transpose(1, 2))[:, li, lj]], dim=1)
        else:
            x0 = z = vectors.reshape(b, -1)
            for v, w, bias in cross:
                z = x0 * F.linear(F.linear(z, v), w, bias) + z
        logits = _mlp(z, top, relu_last=False).squeeze(1)
        y = labels[start: start + chunk].to(torch.float64)
        total += F.binary_cross_entropy_with_logits(logits, y, reduction="sum")
    return total / ids.shape[0]
