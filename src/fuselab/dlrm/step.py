"""One training step of a DLRM as a callable: forward, BCE-with-logits loss, backward, both optimizer updates.

``precision``: ``fp32`` (IEEE matmuls), ``tf32`` (TF32 matmuls on CUDA: sets the process-wide
``torch.backends.cuda.matmul.allow_tf32``), ``bf16`` (bf16 autocast of the forward; the loss in fp32).
``mode``: ``eager``, or ``compile`` (``torch.compile`` of the dense part: the lookup stays eager for its sparse
gradient). ``cuda_graph`` raises ``NotImplementedError`` in this implementation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .model import DLRM
from .optim import Optimizers

__all__ = ["PRECISIONS", "STEP_MODES", "TrainStep"]

PRECISIONS = ("fp32", "tf32", "bf16")
STEP_MODES = ("eager", "compile", "cuda_graph")


class TrainStep:
    """``step(dense [B, 13], sparse [B, F] hashed ids, labels [B]) -> loss`` (0-dim, on the device, not synced).

    Raises ``ValueError`` for an unknown ``precision`` or ``mode``.
    """

    def __init__(self, model: DLRM, optimizers: Optimizers, *, precision: str = "fp32", mode: str = "eager"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if mode not in STEP_MODES:
            raise ValueError(f"mode must be one of {STEP_MODES}, got {mode!r}")
        if mode == "cuda_graph":
            raise NotImplementedError("mode='cuda_graph' needs the graphable step of the fuselab kernels")
        self.model, self.optimizers = model, optimizers
        self.precision, self.mode = precision, mode
        self.loss_fn = nn.BCEWithLogitsLoss()
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        if mode == "compile":
            model.compile_dense(dynamic=False)

    def __call__(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> Tensor:
        device_type = dense.device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            logits = self.model(dense, sparse)
        loss = self.loss_fn(logits.float(), labels)
        loss.backward()
        self.optimizers.step()
        self.optimizers.zero_grad()
        return loss.detach()
