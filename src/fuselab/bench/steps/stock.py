"""The strongest DLRM training step stock PyTorch offers, for the DLRM suite's ``stock`` providers.

What a PyTorch user writes at their best: one ``nn.EmbeddingBag(mode="sum", sparse=True)`` per table with its own
sparse optimizer, ``nn.Linear`` + ReLU MLPs, the ``bmm`` + gather dot interaction (or the low-rank cross layers),
``BCEWithLogits``; everything after the lookup compiled by ``torch.compile`` (the lookup stays eager: ``torch.compile``
does not take sparse gradients), the MLPs' and cross layers' parameters updated by a separate ``torch.optim.Adagrad``
(its fused kernel where this torch has one for the device, else the foreach one). No host synchronization in a step
with ``sparse_optimizer="sgd"``: ``torch.optim.SGD`` adds the sparse gradient into the table as it is. PyTorch has no
row-wise Adagrad, and its Adagrad coalesces a sparse gradient (a host synchronization per table per step):
``"adagrad"`` runs it, for the same optimizer family as the other providers (element-wise state, ``D`` times the
row-wise one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.core.compile import compile_quietly
from fuselab.core.precision import float32_matmul_precision

from .model import DLRMWeights, JaggedIds, pair_indices

SPARSE_OPTIMIZERS = ("sgd", "adagrad")


def _linears(layers: Sequence[tuple[Tensor, Tensor]], relu_last: bool, device: torch.device) -> nn.Sequential:
    modules: list[nn.Module] = []
    for k, (w, b) in enumerate(layers):
        linear = nn.Linear(w.shape[1], w.shape[0], device=device)
        with torch.no_grad():
            linear.weight.copy_(w)
            linear.bias.copy_(b)
        modules.append(linear)
        if relu_last or k < len(layers) - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class DenseParts(nn.Module):
    """Everything of a DLRM after the lookup: ``loss(dense (B, 13), emb (B, F, D), labels (B,))``, with the weights of
    ``weights`` on ``device``. ``autocast``: the dtype the MLPs and the interaction run in (None: fp32)."""

    def __init__(self, weights: DLRMWeights, device: torch.device, autocast: torch.dtype | None = None):
        super().__init__()
        self.shape, self.autocast = weights.shape, autocast
        self.bottom = _linears(weights.bottom, True, device)
        self.top = _linears(weights.top, False, device)
        self.V = nn.ParameterList([nn.Parameter(v.to(device)) for v, _, _ in weights.cross])
        self.W = nn.ParameterList([nn.Parameter(w.to(device)) for _, w, _ in weights.cross])
        self.b = nn.ParameterList([nn.Parameter(b.to(device)) for _, _, b in weights.cross])
        li, lj = pair_indices(self.shape.num_tables + 1, device)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def logits(self, dense: Tensor, emb: Tensor | list[Tensor]) -> Tensor:
        """dense (B, 13), emb (B, F, D) or F tensors (B, D) -> logits (B,)."""
        x = self.bottom(dense)
        parts = [emb.to(x.dtype)] if isinstance(emb, Tensor) else [e.to(x.dtype)[:, None] for e in emb]
        vectors = torch.cat([x[:, None], *parts], dim=1)
        if self.shape.interaction == "dot":
            z = torch.cat([x, torch.bmm(vectors, vectors.transpose(1, 2))[:, self.li, self.lj]], dim=1)
        else:
            x0 = z = vectors.reshape(x.shape[0], -1)
            for v, w, b in zip(self.V, self.W, self.b):
                z = x0 * F.linear(F.linear(z, v), w, b) + z
        return self.top(z).squeeze(1)

    def loss(self, dense: Tensor, emb: Tensor | list[Tensor], labels: Tensor) -> Tensor:
        cast = contextlib.nullcontext() if self.autocast is None else torch.autocast(dense.device.type, self.autocast)
        with cast:
            logits = self.logits(dense, emb)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)


class StockDLRM(nn.Module):
    """Per-table ``nn.EmbeddingBag(sparse=True)`` and :class:`DenseParts`: ``lookup(ids (B, S))`` -> F pooled
    ``(B, D)`` (each table's bags contiguous after one gather of the batch's ids, :class:`~.model.JaggedIds`)."""

    def __init__(self, weights: DLRMWeights, device: torch.device, autocast: torch.dtype | None = None):
        super().__init__()
        shape = self.shape = weights.shape
        self.tables = nn.ModuleList()
        for t, n in enumerate(shape.table_sizes):
            bag = nn.EmbeddingBag(n, shape.dim, mode="sum", sparse=True, device=device)
            weights.fill_table_(bag.weight.data, t)
            self.tables.append(bag)
        self.dense = DenseParts(weights, device, autocast)
        self.ids = JaggedIds(shape, device)
        self._bags: dict[int, list[tuple[int, int, Tensor]]] = {}

    def bags(self, batch: int) -> list[tuple[int, int, Tensor]]:
        """(first, last) of each table's ids among the gathered values, and its bags' offsets, for ``batch``."""
        if batch not in self._bags:
            ends = torch.tensor(self.shape.bags).cumsum(0) * batch
            self._bags[batch] = [(int(end) - n * batch, int(end), torch.arange(0, n * batch, n, device=self.ids.device))
                                 for n, end in zip(self.shape.bags, ends)]
        return self._bags[batch]

    def lookup(self, ids: Tensor) -> list[Tensor]:
        values, _, _ = self.ids(ids)
        return [bag(values[a:b], offsets) for (a, b, offsets), bag in zip(self.bags(ids.shape[0]), self.tables)]


def dense_adagrad(params: list[Tensor], lr: float, eps: float) -> torch.optim.Adagrad:
    """``torch.optim.Adagrad`` of the dense parameters: fused where this torch's fused Adagrad steps on their device
    (tried on a one-element parameter: torch 2.11 accepts ``fused=True`` for CUDA and refuses it at the first
    step), else foreach."""
    probe = torch.zeros(1, device=params[0].device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        torch.optim.Adagrad([probe], fused=True).step()
        return torch.optim.Adagrad(params, lr=lr, eps=eps, fused=True)
    except RuntimeError:
        return torch.optim.Adagrad(params, lr=lr, eps=eps, foreach=True)


class StockStep:
    """``step(dense, ids, labels) -> loss``: zero the gradients, lookup, loss (compiled with ``compile``), backward,
    both updates; ``sparse_optimizer`` one of :data:`SPARSE_OPTIMIZERS` for the tables. fp32 runs (``autocast``
    None) use IEEE fp32 matmuls. Raises ``ValueError`` for an unknown ``sparse_optimizer``."""

    def __init__(self, model: StockDLRM, *, sparse_optimizer: str, lr_sparse: float, lr_dense: float, eps: float,
                 compile: bool):
        if sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise ValueError(f"sparse_optimizer must be one of {SPARSE_OPTIMIZERS}, got {sparse_optimizer!r}")
        self.model = model
        tables = list(model.tables.parameters())
        self.sparse = (torch.optim.SGD(tables, lr=lr_sparse) if sparse_optimizer == "sgd"
                       else torch.optim.Adagrad(tables, lr=lr_sparse, eps=eps))
        self.dense = dense_adagrad(list(model.dense.parameters()), lr_dense, eps)
        self.loss = compile_quietly(model.dense.loss, dynamic=False) if compile else model.dense.loss

    def __call__(self, dense: Tensor, ids: Tensor, labels: Tensor) -> Tensor:
        precise = self.model.dense.autocast is None
        with float32_matmul_precision("highest") if precise else contextlib.nullcontext():
            self.sparse.zero_grad(set_to_none=True)
            self.dense.zero_grad(set_to_none=True)
            loss = self.loss(dense, self.model.lookup(ids), labels)
            loss.backward()
            self.dense.step()
            with torch.sparse.check_sparse_tensor_invariants(enable=False):  # Adagrad's own COO tensors: no checks
                self.sparse.step()
        return loss.detach()
