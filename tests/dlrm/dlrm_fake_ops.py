"""Plain-torch stand-ins with the API of fuselab's embedding collection and dot interaction, so the DLRM's
``kernels="fuselab"`` wiring (padding, fused update through backward, learning rates, state) is tested before
and independently of the kernels. ``install(monkeypatch)`` puts them in ``sys.modules`` for one test; the
``fuselab_ops`` fixture runs a test with them and with the real ops.

The stand-in embedding collection follows the specification the kernels implement: all tables in one fp32
weight (row offsets per table), ``id % rows`` applied to raw ids, the optimizer update applied in place during
backward with duplicate ids summed first (sorted unique rows), no gradient left on the weight.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from torch import Tensor, nn


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: Tensor, rows: Tensor, module: FakeEmbeddingBagCollection) -> Tensor:
        ctx.rows, ctx.module = rows, module
        return weight[rows]

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.module.update(ctx.rows.reshape(-1), grad.reshape(-1, grad.shape[-1]))
        return None, None, None


class FakeEmbeddingBagCollection(nn.Module):
    def __init__(self, table_sizes, dim, *, optimizer="rowwise_adagrad", lr=0.01, eps=1e-8, pooling="sum",
                 deterministic=True, device=None, generator=None):
        super().__init__()
        sizes = torch.tensor([int(n) for n in table_sizes])
        ends = sizes.cumsum(0)
        self.optimizer, self.eps = optimizer.name, getattr(optimizer, "eps", 0.0)
        self.weight = nn.Parameter(torch.empty(int(ends[-1]), dim))
        with torch.no_grad():
            for t, n in enumerate(sizes.tolist()):
                self.weight[ends[t] - n: ends[t]].uniform_(-1 / math.sqrt(n), 1 / math.sqrt(n), generator=generator)
        self.register_buffer("row_offsets", ends - sizes)
        self.register_buffer("rows", sizes, persistent=False)
        self.register_buffer("state", torch.zeros(optimizer.state_shape(int(ends[-1]), dim)))
        self.register_buffer("lr", torch.tensor(float(lr)), persistent=False)

    def set_lr(self, lr: float) -> None:
        self.lr.fill_(lr)

    def forward(self, ids: Tensor, offsets=None) -> Tensor:
        return _Lookup.apply(self.weight, ids % self.rows + self.row_offsets, self)

    @torch.no_grad()
    def update(self, rows: Tensor, grad: Tensor) -> None:
        unique, inverse = torch.unique(rows, return_inverse=True)
        g = torch.zeros(len(unique), grad.shape[1], dtype=grad.dtype).index_add_(0, inverse, grad)
        if self.optimizer == "sgd":
            step = g
        else:
            square = g * g if self.optimizer == "adagrad" else (g * g).mean(1)
            self.state.index_add_(0, unique, square)
            std = self.state[unique].sqrt() + self.eps
            step = g / (std if self.optimizer == "adagrad" else std.unsqueeze(1))
        self.weight.index_add_(0, unique, step * -self.lr)


def fake_dot_interaction(dense: Tensor, emb: Tensor, *, self_interaction: bool = False, pad_to: int = 1) -> Tensor:
    vectors = torch.cat([dense.unsqueeze(1), emb], dim=1)
    gram = torch.bmm(vectors, vectors.transpose(1, 2))
    rows, cols = torch.tril_indices(vectors.shape[1], vectors.shape[1], offset=0 if self_interaction else -1)
    out = torch.cat([dense, gram[:, rows, cols]], dim=1)
    return nn.functional.pad(out, (0, -out.shape[1] % pad_to))


def install(monkeypatch) -> None:
    embedding = types.ModuleType("fuselab.ops.embedding")
    embedding.EmbeddingBagCollection = FakeEmbeddingBagCollection
    interaction = types.ModuleType("fuselab.ops.interaction")
    interaction.dot_interaction = fake_dot_interaction
    monkeypatch.setitem(sys.modules, "fuselab.ops.embedding", embedding)
    monkeypatch.setitem(sys.modules, "fuselab.ops.interaction", interaction)


@pytest.fixture(params=["stand-in", "kernels"])
def fuselab_ops(request, monkeypatch) -> str:
    """Runs a test with the stand-ins above, then with fuselab's real ops."""
    if request.param == "stand-in":
        install(monkeypatch)
    return request.param
