"""The ``fb-dlrm-baseline`` provider of ``benchmarks/dlrm_gpu.py``: a compact eager re-creation of the model and
training step of facebookresearch/dlrm (``dlrm_s_pytorch.py``, its Kaggle run), written for this project from
a reading of how that script works (no code copied).

What is kept from the reference:

* one ``nn.EmbeddingBag(n, D, mode="sum", sparse=True)`` per sparse feature, one index per bag (offsets
  ``0..B-1``), weights ``U(-sqrt(1/n), sqrt(1/n))``;
* MLPs of ``nn.Linear`` + ``nn.ReLU`` in an ``nn.Sequential``, ``W ~ N(0, sqrt(2/(fan_in+fan_out)))``,
  ``b ~ N(0, sqrt(1/fan_out))``; the top MLP ends in ``nn.Sigmoid`` (the model outputs probabilities);
* the "dot" interaction: ``torch.bmm`` of the ``(B, F+1, D)`` stack with its transpose, the strict lower
  triangle picked with index tensors ``li, lj`` that are rebuilt (on the host) at every call, then
  ``cat([x, Zflat])``;
* ``nn.BCELoss`` on the sigmoid output, one ``torch.optim.SGD`` (lr 0.1) over all parameters (sparse
  gradients for the tables), and per step: forward, loss, loss and predictions copied to the host to count
  loss/accuracy, ``zero_grad``, ``backward``, ``step``.

What differs (documented in ``benchmarks/notes/dlrm.md``): inputs come from fuselab's prefetching
``BatchLoader`` (the same batches the fuselab providers see) instead of the reference's ``DataLoader``; the
per-table index lists are rows of one transposed ``[F, B]`` device tensor and one device ``arange`` serves as
the offsets of every table (the reference's collate builds them on the host and copies them to the device every
step); the host accuracy count uses torch on CPU tensors instead of numpy; weights are
initialised on the device with torch's RNG instead of numpy (start-up time only); no learning-rate schedule
(the Kaggle run uses none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


def create_mlp(widths: Sequence[int], sigmoid_layer: int, device: torch.device | str = "cpu",
               generator: torch.Generator | None = None) -> nn.Sequential:
    """Linear layers ``widths[k] -> widths[k+1]``, each followed by ReLU, or Sigmoid at ``sigmoid_layer``."""
    layers: list[nn.Module] = []
    for k in range(len(widths) - 1):
        fan_in, fan_out = int(widths[k]), int(widths[k + 1])
        linear = nn.Linear(fan_in, fan_out, bias=True, device=device)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=generator)
            linear.bias.normal_(0.0, math.sqrt(1.0 / fan_out), generator=generator)
        layers.append(linear)
        layers.append(nn.Sigmoid() if k == sigmoid_layer else nn.ReLU())
    return nn.Sequential(*layers)


class ReferenceDLRM(nn.Module):
    """DLRM as the reference builds it: ``forward(dense [B, 13], offsets, indices) -> probabilities [B, 1]``.

    ``bottom`` and ``top`` are the full layer widths (``bottom[0] = 13``, ``top[0]`` = interaction width,
    ``top[-1] = 1``), like the reference's ``--arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1``
    once the interaction width is prepended.
    """

    def __init__(self, table_sizes: Sequence[int], dim: int, bottom: Sequence[int], top: Sequence[int],
                 device: torch.device | str = "cpu", seed: int = 0):
        super().__init__()
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.emb_l = nn.ModuleList()
        for n in table_sizes:
            bag = nn.EmbeddingBag(int(n), dim, mode="sum", sparse=True, device=device)
            with torch.no_grad():
                bag.weight.uniform_(-math.sqrt(1.0 / n), math.sqrt(1.0 / n), generator=gen)
            self.emb_l.append(bag)
        self.bot_l = create_mlp(bottom, sigmoid_layer=-1, device=device, generator=gen)
        self.top_l = create_mlp(top, sigmoid_layer=len(top) - 2, device=device, generator=gen)

    @staticmethod
    def interaction_width(num_sparse: int, dim: int) -> int:
        """Width of ``cat([x, Zflat])``: D + (F+1)F/2."""
        return dim + (num_sparse + 1) * num_sparse // 2

    @classmethod
    def from_config(cls, cfg, table_sizes: Sequence[int], device: torch.device | str = "cpu") -> ReferenceDLRM:
        """The architecture of a fuselab :class:`~fuselab.dlrm.config.DLRMConfig` (dot interaction only)."""
        if cfg.interaction != "dot" or cfg.self_interaction:
            raise ValueError("the reference baseline supports the dot interaction without self-interaction only")
        width = cls.interaction_width(len(table_sizes), cfg.embedding_dim)
        return cls(table_sizes, cfg.embedding_dim, [13, *cfg.bottom_mlp], [width, *cfg.top_mlp], device, cfg.seed)

    def apply_emb(self, offsets: Sequence[Tensor], indices: Sequence[Tensor]) -> list[Tensor]:
        """One ``EmbeddingBag`` call per table: ``[B, D]`` each."""
        return [bag(indices[k], offsets[k]) for k, bag in enumerate(self.emb_l)]

    def interact_features(self, x: Tensor, ly: Sequence[Tensor]) -> Tensor:
        """x [B, D], ly F x [B, D] -> [B, D + (F+1)F/2]: x, then Z[i, j] for j < i, row-major."""
        batch, dim = x.shape
        t = torch.cat([x, *ly], dim=1).view(batch, -1, dim)
        z = torch.bmm(t, t.transpose(1, 2))
        _, ni, nj = z.shape
        # the reference rebuilds these host index tensors on every call (indexing copies them to the device)
        li = torch.tensor([i for i in range(ni) for j in range(i)])
        lj = torch.tensor([j for i in range(nj) for j in range(i)])
        return torch.cat([x, z[:, li, lj]], dim=1)

    def forward(self, dense: Tensor, offsets: Sequence[Tensor], indices: Sequence[Tensor]) -> Tensor:
        x = self.bot_l(dense)
        ly = self.apply_emb(offsets, indices)
        return self.top_l(self.interact_features(x, ly))


def reference_inputs(rows: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Table rows [B, F] -> (offsets, indices): F offset tensors ``0..B-1`` and F index tensors of B rows.

    The reference's collate function produces the same lists from a ``[F, B]`` layout.
    """
    batch, features = rows.shape
    indices = list(rows.t().contiguous().unbind(0))
    offsets = torch.arange(batch, device=rows.device)
    return [offsets] * features, indices


class ReferenceTrainer:
    """The reference's training step around :class:`ReferenceDLRM` (SGD, BCE on probabilities).

    ``step(dense, rows, labels, timer)`` takes table rows (already hashed) and a
    :class:`fuselab.dlrm.train.PhaseTimer`-like object (``phase(name)`` context manager); returns the loss.
    """

    def __init__(self, model: ReferenceDLRM, lr: float = 0.1):
        self.model = model
        self.loss_fn = nn.BCELoss(reduction="mean")
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        self.loss_sum = 0.0
        self.correct = 0
        self.samples = 0

    def step(self, dense: Tensor, rows: Tensor, labels: Tensor, timer) -> Tensor:
        with timer.phase("forward"):
            offsets, indices = reference_inputs(rows)
            z = self.model(dense, offsets, indices)
            target = labels.view(-1, 1)
            loss = self.loss_fn(z, target)
            # the reference reads the loss and the predictions back every step (loss/accuracy counters)
            host_loss, host_z = loss.detach().cpu(), z.detach().cpu()
            self.correct += int((host_z.round() == target.cpu()).sum())
            self.loss_sum += float(host_loss) * len(labels)
            self.samples += len(labels)
        with timer.phase("backward"):
            self.optimizer.zero_grad()
            loss.backward()
        with timer.phase("optimizer"):
            self.optimizer.step()
        return loss.detach()
