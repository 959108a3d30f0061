"""``fuselab dlrm export --onnx FILE``: a trained checkpoint -> ONNX, checked in onnxruntime.

The ONNX graph takes ``dense`` [B, 13] float32 (already log-transformed, as in the shards) and ``sparse``
[B, F] int64 ([B, S] for multi-hot bags, S the sum of the bag sizes), and returns ``logits`` [B] and
``probabilities`` [B] (sigmoid). With ``hashing="modulus"`` the graph applies ``id mod rows`` itself, so raw ids
work; with ``hashing="vocab"`` ``sparse`` must already be vocabulary rows (the vocabulary lookup, a sorted search,
stays outside the graph). B is a dynamic axis.

The output is one self-contained ``.onnx`` file when the model's weights fit ONNX's 2 GB protobuf limit
(:data:`ONNX_LIMIT_BYTES`), else the graph in ``FILE`` and the weights in ``FILE.data`` beside it (the two load
together). The output path is checked before the checkpoint is read (and the checkpoint against its manifest);
the files are exported to a temporary folder beside the output, checked, then renamed into place with the usual
permissions, so a failed export leaves no partial file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fuselab._io import PathError, writable_file

from .checkpoint import open_checkpoint
from .config import DLRMConfig, config_from_dict
from .data.textin import os_errors_as_path_errors
from .model import DLRM


class ExportedDLRM(nn.Module):
    """``forward(dense (B, 13), sparse (B, S)) -> (logits, probabilities)``; ``S`` = F, or the sum of the
    multi-hot bag sizes (``sizes`` then holds each column's table size)."""

    def __init__(self, model: DLRM, sizes: list[int], hashing: str, multi_hot_sizes: list[int] | None = None):
        super().__init__()
        self.model = model
        self.hashing = hashing
        columns = torch.tensor(sizes, dtype=torch.int64)
        if multi_hot_sizes is not None:
            columns = columns.repeat_interleave(torch.tensor(multi_hot_sizes, dtype=torch.int64))
        self.register_buffer("sizes", columns)

    def forward(self, dense: Tensor, sparse: Tensor) -> tuple[Tensor, Tensor]:
        if self.hashing == "modulus":
            sparse = torch.remainder(sparse, self.sizes)
        logits = self.model(dense, sparse)
        return logits, torch.sigmoid(logits)


#: the largest ONNX file protobuf can hold; a model whose weights (and a margin for the graph) pass it is written
#: with its weights in a separate ``.data`` file
ONNX_LIMIT_BYTES = 2**31
_GRAPH_MARGIN_BYTES = 64 << 20


def _warn(message: str) -> None:
    print(f"fuselab dlrm: {message}", file=sys.stderr)


def model_from_checkpoint(path: str | Path, log: Callable[[str], Any] = _warn) -> tuple[ExportedDLRM, DLRMConfig]:
    """Rebuild the model of a checkpoint file (or checkpoint directory: its latest), checked against its manifest,
    in eval mode; ``log`` gets the warnings."""
    _, state = open_checkpoint(path, log=log)
    cfg = config_from_dict(state["config"])
    model = DLRM.from_config(cfg, list(state["table_sizes"]), kernels="torch")
    model.load_state_dict(state["model"])
    return ExportedDLRM(model.eval(), state["table_sizes"], cfg.hashing, cfg.multi_hot_sizes).eval(), cfg


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


#: what torch's exporter warns at every export of this model, that no caller can act on: torch's own use of a
#: deprecated pytree check, and both inputs sharing the "batch" axis (as they should; the name is kept)
EXPORTER_NOTICES = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"# The axis name: batch will not be used, since it shares the same shape constraints with another axis: "
     r"batch\.$", UserWarning),
)


class _DropTorchvisionNotice(logging.Filter):
    """The exporter logs "torchvision is not installed. Skipping torchvision::nms" (and 3 more) at every export:
    irrelevant to a model without torchvision ops."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torchvision is not installed")


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    notice = _DropTorchvisionNotice()
    logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            for message, category in EXPORTER_NOTICES:
                warnings.filterwarnings("ignore", message, category)
            yield
    finally:
        logger.removeFilter(notice)


def export_onnx(checkpoint: str | Path, out: str | Path, batch_size: int = 4, opset: int = 18,
                check: bool = True) -> Path:
    """Export the checkpoint's model to ``out`` (one file under :data:`ONNX_LIMIT_BYTES`, else ``out`` and
    ``out.data``); with ``check``, compare onnxruntime with PyTorch.

    Raises :class:`fuselab._io.PathError` (a ``ValueError`` naming the path) when ``out`` cannot be written,
    before the checkpoint is read, and ``ValueError`` when logits or probabilities differ by more than 1e-4
    (``out`` is then left as it was)."""
    out = writable_file(out, "ONNX file")
    with os_errors_as_path_errors("export: cannot read"):
        exported, _ = model_from_checkpoint(checkpoint)
    example = _example(exported.sizes.tolist(), batch_size)
    batch = torch.export.Dim("batch")
    weights = sum(t.numel() * t.element_size() for t in exported.state_dict().values())
    external = weights + _GRAPH_MARGIN_BYTES >= ONNX_LIMIT_BYTES
    try:
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    except OSError as err:
        raise PathError(f"cannot write ONNX file {out}: {err.strerror or err}") from None
    tmp = staging / out.name  # the same name: external weights (<name>.data) are referenced by name
    try:
        with _quiet_exporter():
            torch.onnx.export(exported, example, tmp, input_names=["dense", "sparse"],
                              output_names=["logits", "probabilities"], opset_version=opset, dynamo=True,
                              dynamic_shapes=({0: batch}, {0: batch}), verbose=False, external_data=external)
        if check:
            err = check_onnx(tmp, exported)  # loads <name>.data from the staging folder
            if err > 1e-4:
                raise ValueError(f"ONNX model disagrees with PyTorch: max abs difference {err:.3e}")
        mask = os.umask(0)
        os.umask(mask)
        for part in sorted(staging.iterdir(), key=lambda p: p == tmp):  # the weights first, the graph last
            os.chmod(part, 0o666 & ~mask)
            os.replace(part, out.parent / part.name)
    except OSError as err:
        raise PathError(f"cannot write ONNX file {out}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
