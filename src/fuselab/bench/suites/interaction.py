"""Benchmark suite: the DLRM dot interaction ``[dense, pairwise dot products, zero padding]``
(:func:`fuselab.ops.interaction.dot_interaction`).

Providers: ``eager``, the DLRM's eager code (``cat`` + ``bmm`` to the full ``B x N x N`` Gram matrix + a gather of
the lower triangle + ``cat``, as ``fuselab.dlrm.model.InteractionArch``; ``F.pad`` when padded), ``torch.compile``
of it, and ``fuselab`` (Triton: no Gram matrix in memory, no gather).

Cost model per case, ``B`` rows, ``N = F + 1`` vectors of length ``D``, ``P = N(N-1)/2`` pairs, output width
``W >= D + P``, itemsize ``s`` (each input read once, each output written once):

* ``fwd``: read dense and emb ``B·N·D·s``, write ``B·W·s``; flops ``2·B·P·D``;
* ``bwd``: read the gradient's ``D + P`` used columns ``B·(D + P)·s`` and the saved dense and emb ``B·N·D·s``,
  write their gradients ``B·N·D·s``; flops ``4·B·P·D`` (each pair feeds two gradient vectors) ``+ B·D``;
* ``fwd+bwd``: both.

Kaggle (B 65536, F 26, D 16, bf16, W 367): forward 56.6 MB read + 48.1 MB written = 104.7 MB, 0.74 GFLOP;
backward 48.1 + 56.6 MB read + 56.6 MB written = 161.3 MB, 1.47 GFLOP: memory-bound (~5-10 flop/byte),
~55 µs for both at the H200's 4.8 TB/s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fuselab.bench import providers
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec
from fuselab.bench.suites._sizes import L2_COLD_BELOW
from fuselab.reference import interaction as ref

FP32, BF16 = torch.float32, torch.bfloat16
DEFAULT_MODES = ("fwd", "fwd+bwd")
#: (B, F, D, pad_to) on GPUs: Criteo Kaggle at two batch sizes, its padded width (368), a larger D
GPU_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (8192, 26, 16, 1), (65536, 26, 16, 1), (65536, 26, 16, 8), (65536, 26, 128, 1))
GPU_QUICK: tuple[tuple[int, int, int, int], ...] = ((65536, 26, 16, 1),)
CPU_SHAPES: tuple[tuple[int, int, int, int], ...] = ((16, 26, 16, 1), (9, 5, 13, 8))
CPU_QUICK: tuple[tuple[int, int, int, int], ...] = ((9, 5, 13, 8),)
DEFAULT_DTYPES = (FP32, BF16)
QUICK_DTYPES = (BF16,)


def case_bytes(b: int, f: int, d: int, pad_to: int, itemsize: int, mode: str) -> tuple[int, int]:
    """(bytes moved, bytes read) of one call in ``mode`` (module docstring)."""
    n, p = f + 1, ref.num_pairs(f)
    width = ref.output_width(f, d, False, pad_to)
    fwd_read, fwd_write = b * n * d, b * width
    bwd_read, bwd_write = b * (d + p) + b * n * d, b * n * d
    read = {"fwd": fwd_read, "bwd": bwd_read, "fwd+bwd": fwd_read + bwd_read}[mode]
    write = {"fwd": fwd_write, "bwd": bwd_write, "fwd+bwd": fwd_write + bwd_write}[mode]
    return (read + write) * itemsize, read * itemsize


def case_flops(b: int, f: int, d: int, mode: str) -> int:
    p = ref.num_pairs(f)
    fwd, bwd = 2 * b * p * d, 4 * b * p * d + b * d
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def cases(query: CaseQuery) -> list[BenchCase]:
    if query.device_type == "cuda":
        shapes = GPU_QUICK if query.quick else GPU_SHAPES
    else:
        shapes = CPU_QUICK if query.quick else CPU_SHAPES
    out = []
    for dtype, mode in query.combinations(QUICK_DTYPES if query.quick else DEFAULT_DTYPES, DEFAULT_MODES):
        for b, f, d, pad_to in shapes:
            nbytes, read = case_bytes(b, f, d, pad_to, dtype.itemsize, mode)
            label = f"{b}x{f}x{d}" + (f"-pad{pad_to}" if pad_to > 1 else "")
            out.append(BenchCase(op="interaction", label=label, dtype=dtype, mode=mode, bytes=nbytes,
                                 flops=case_flops(b, f, d, mode), numel=b * (f + 1) * d,
                                 params={"shape": (b, f, d), "pad_to": pad_to},
                                 l2_cold=nbytes < L2_COLD_BELOW, read_bytes=read))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple:
    """(dense, emb, self_interaction, pad_to): fresh normal tensors, emb scaled like embedding rows."""
    b, f, d = case.params["shape"]
    dense = torch.randn(b, d, dtype=case.dtype, device=device)
    emb = torch.randn(b, f, d, dtype=case.dtype, device=device)
    return dense, emb, False, int(case.params["pad_to"])


def reference(dense, emb, self_interaction, pad_to):
    return ref.dot_interaction(dense, emb, self_interaction, pad_to)


#: (F, self_interaction, device) -> the gather's row and column indices, built once (the DLRM's InteractionArch
#: keeps them as buffers); a plain dict, which torch.compile traces (it does not see through functools caches)
_PAIR_INDEX: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _pair_index(num_sparse: int, self_interaction: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (num_sparse, self_interaction, device)
    if key not in _PAIR_INDEX:
        _PAIR_INDEX[key] = ref.pair_rows_cols(num_sparse, self_interaction, device)
    return _PAIR_INDEX[key]


def eager_interaction(dense, emb, self_interaction: bool, pad_to: int):
    """The DLRM's eager interaction (InteractionArch): cat, bmm to the Gram matrix, gather, cat, pad."""
    rows, cols = _pair_index(emb.shape[1], self_interaction, dense.device)
    vectors = torch.cat([dense.unsqueeze(1), emb], dim=1)
    gram = torch.bmm(vectors, vectors.transpose(1, 2))
    out = torch.cat([dense, gram[:, rows, cols]], dim=1)
    pad = -out.shape[1] % pad_to
    return F.pad(out, (0, pad)) if pad else out


def fuselab_interaction(dense, emb, self_interaction: bool, pad_to: int):
    from fuselab.ops.interaction import dot_interaction

    return dot_interaction(dense, emb, self_interaction=self_interaction, pad_to=pad_to)


SPEC = OpSpec(
    name="interaction",
    summary="DLRM dot interaction [dense, pairs, pad]: eager bmm + gather vs torch.compile vs fuselab",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        providers.eager(eager_interaction, description="cat + bmm (B x N x N Gram) + lower-triangle gather + cat"),
        providers.compiled(eager_interaction),
        providers.fuselab(fuselab_interaction, description="fuselab dot_interaction (Triton, no Gram matrix)"),
    ),
    grad_args=lambda case: (0, 1),
)
