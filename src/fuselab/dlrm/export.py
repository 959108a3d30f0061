"""``fuselab dlrm export --onnx FILE``: a trained checkpoint -> ONNX, checked in onnxruntime.

The ONNX graph takes ``dense`` [B, 13] float32 (already log-transformed, as in the shards) and ``sparse``
[B, F] int64, and returns ``logits`` [B] and ``probabilities`` [B] (sigmoid). With ``hashing="modulus"`` the
graph applies ``id mod rows`` itself, so raw ids work; with ``hashing="vocab"`` ``sparse`` must already be
vocabulary rows (the vocabulary lookup, a sorted search, stays outside the graph). B is a dynamic axis.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .checkpoint import load_checkpoint, resolve_checkpoint
from .config import DLRMConfig
from .model import DLRM


class ExportedDLRM(nn.Module):
    def __init__(self, model: DLRM, sizes: list[int], hashing: str):
        super().__init__()
        self.model = model
        self.hashing = hashing
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.int64))

    def forward(self, dense: Tensor, sparse: Tensor) -> tuple[Tensor, Tensor]:
        if self.hashing == "modulus":
            sparse = torch.remainder(sparse, self.sizes)
        logits = self.model(dense, sparse)
        return logits, torch.sigmoid(logits)


def model_from_checkpoint(path: str | Path) -> tuple[ExportedDLRM, DLRMConfig]:
    """Rebuild the model of a checkpoint file (or checkpoint directory: its latest), in eval mode."""
    state = load_checkpoint(resolve_checkpoint(path, None))
    cfg = DLRMConfig(**state["config"])
    model = DLRM.from_config(cfg, state["table_sizes"])
    model.load_state_dict(state["model"])
    return ExportedDLRM(model.eval(), state["table_sizes"], cfg.hashing).eval(), cfg


def _example(sizes: list[int], batch: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, 13, generator=gen) * 5
    sparse = torch.stack([torch.randint(0, n, (batch,), generator=gen) for n in sizes], dim=1)
    return dense, sparse


def check_onnx(path: str | Path, exported: ExportedDLRM, batch: int = 37) -> float:
    """Max |probability difference| between onnxruntime (CPU) and PyTorch on a fresh random batch."""
    import onnxruntime as ort

    dense, sparse = _example(exported.sizes.tolist(), batch, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits, probs = session.run(None, {"dense": dense.numpy(), "sparse": sparse.numpy()})
    with torch.no_grad():
        ref_logits, ref_probs = exported(dense, sparse)
    return float(max(np.abs(probs - ref_probs.numpy()).max(), np.abs(logits - ref_logits.numpy()).max()))


def export_onnx(checkpoint: str | Path, out: str | Path, batch_size: int = 4, opset: int = 18,
                check: bool = True) -> Path:
    """Export the checkpoint's model to ``out``; with ``check``, compare onnxruntime with PyTorch
    (``ValueError`` when logits or probabilities differ by more than 1e-4)."""
    exported, _ = model_from_checkpoint(checkpoint)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    example = _example(exported.sizes.tolist(), batch_size)
    batch = torch.export.Dim("batch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter-internal deprecation chatter
        torch.onnx.export(exported, example, str(out), input_names=["dense", "sparse"],
                          output_names=["logits", "probabilities"], opset_version=opset, dynamo=True,
                          dynamic_shapes=({0: batch}, {0: batch}), verbose=False)
    if check:
        err = check_onnx(out, exported)
        if err > 1e-4:
            raise ValueError(f"ONNX model disagrees with PyTorch: max abs difference {err:.3e}")
    return out
