"""Benchmark suite: the embedding bag collection (fuselab.ops.embedding), lookup and lookup + fused optimizer update.

Shapes: the Criteo Kaggle tables (26 features, 33.8M rows, D=16: 64 B per fp32 row) at batch 65536 and 8192 on GPUs,
the same cardinalities scaled by 1e-4 at batch 32 on CPUs; one id per feature drawn from a bounded power law
(exponent 1.2, like ``fuselab dlrm synth``: many duplicates), fixed by a seed so the byte count is exact.

Two kinds of case, both timed in the harness's ``fwd`` mode (the update's result is the mutated table, not a
gradient, so the autograd modes do not apply): ``lookup`` returns the ``(B, F, D)`` embeddings; ``update-<optimizer>``
returns ``(embeddings, weight, state)`` after one lookup and one optimizer step for a given output gradient.
Every call of the update mutates the table again (the harness times repeated steps, as training does).

Providers: eager PyTorch (``index_select`` lookup; the update as torch.optim.Adagrad does it for
``F.embedding(sparse=True)``: a COO gradient, ``coalesce`` (sort + segment sum), index ops on the unique rows; it
synchronises with the host), torch.compile of the static-shape reference (stable sort, ``index_add_`` segment sums,
``index_put_`` of every sorted position: no host sync) and fuselab (one lookup kernel; rows kernel + ``torch.sort``
+ segment and carry kernels).

Cost model, ``N = B*F`` id positions, ``U`` distinct rows among them, row ``D*4`` bytes, state per row ``S`` bytes
(0 sgd, 4 rowwise_adagrad, ``D*4`` adagrad): lookup reads N int64 ids and N rows and writes N rows:
``N*(8 + 2*D*4)``; the update adds the output gradient read once (``N*D*4``), the ids read again (``N*8``) and a
read-modify-write of each distinct row and its state (``U*2*(D*4 + S)``). Sorting is not counted (an algorithm's
overhead, not a minimum). Flops: the update's ``N*D`` additions of duplicates plus about ``6*U*D`` for the optimizer.
"""

from __future__ import annotations

import functools

import torch

from fuselab.bench import providers
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec
from fuselab.core.embedding_optimizer import embedding_optimizer
from fuselab.reference import embedding as ref

#: Criteo Kaggle cardinalities (also ``fuselab.dlrm.data.shards.KAGGLE_CARDINALITIES``; bench cannot import dlrm)
KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
DIM = 16
GPU_BATCHES: tuple[int, ...] = (65536, 8192)
CPU_BATCH = 32
CPU_SCALE = 1e-4
ZIPF_ALPHA = 1.2
LR, EPS = 0.01, 1e-8
KINDS: tuple[str, ...] = ("lookup", "update-rowwise_adagrad", "update-adagrad", "update-sgd")
QUICK_KINDS: tuple[str, ...] = ("lookup", "update-rowwise_adagrad")


def cardinalities(device_type: str) -> tuple[int, ...]:
    if device_type == "cuda":
        return KAGGLE_CARDINALITIES
    return tuple(max(2, round(n * CPU_SCALE)) for n in KAGGLE_CARDINALITIES)


@functools.cache
def power_law_ids(batch: int, sizes: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """(B, F) int64 ids on the CPU: a bounded continuous Zipf over each table's rows, ranks scrambled by a bijection."""
    gen = torch.Generator().manual_seed(seed)
    cols = []
    a = 1.0 - ZIPF_ALPHA
    for n in sizes:
        u = torch.rand(batch, generator=gen, dtype=torch.float64)
        x = (u * ((n + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
        rank = torch.clamp(x.to(torch.int64) - 1, 0, n - 1)
        cols.append((rank * 2654435761) % n)
    return torch.stack(cols, dim=1)


def _state_bytes(optimizer: str) -> int:
    return 4 * embedding_optimizer(optimizer).state_floats_per_row(DIM)


def case_cost(batch: int, sizes: tuple[int, ...], kind: str) -> tuple[int, int, int]:
    """(bytes, read bytes, flops) of one call (see the module docstring)."""
    n = batch * len(sizes)
    row = 4 * DIM
    read, written = n * (8 + row), n * row
    if kind == "lookup":
        return read + written, read, 0
    optimizer = kind.removeprefix("update-")
    starts = torch.tensor([0, *sizes[:-1]], dtype=torch.int64).cumsum(0)
    unique = int(torch.unique(power_law_ids(batch, sizes) + starts).numel())
    rmw = unique * (row + _state_bytes(optimizer))
    read += n * row + n * 8 + rmw
    written += rmw
    return read + written, read, n * DIM + 6 * unique * DIM


def cases(query: CaseQuery) -> list[BenchCase]:
    if query.dtypes is not None and torch.float32 not in query.dtypes:
        return []
    if query.modes is not None and "fwd" not in query.modes:
        return []
    sizes = cardinalities(query.device_type)
    batches = (GPU_BATCHES[:1] if query.quick else GPU_BATCHES) if query.device_type == "cuda" else (CPU_BATCH,)
    out = []
    for batch in batches:
        for kind in QUICK_KINDS if query.quick else KINDS:
            nbytes, read, flops = case_cost(batch, sizes, kind)
            out.append(BenchCase(op="embedding", label=f"B={batch}-F={len(sizes)}-D={DIM}-{kind}",
                                 dtype=torch.float32, mode="fwd", bytes=nbytes, flops=flops,
                                 numel=batch * len(sizes) * DIM, read_bytes=read,
                                 params={"batch": batch, "sizes": sizes, "kind": kind}))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple:
    """(weight, state, ids, grad, lr, table_sizes, row_offsets, kind): fresh weights, state and output gradient;
    the seeded power-law ids of the case."""
    sizes, batch, kind = case.params["sizes"], case.params["batch"], case.params["kind"]
    rows = sum(sizes)
    weight = (torch.rand(rows, DIM, device=device) - 0.5) * 0.1
    optimizer = "sgd" if kind == "lookup" else kind.removeprefix("update-")
    state = torch.rand(embedding_optimizer(optimizer).state_shape(rows, DIM), device=device)
    grad = torch.randn(batch, len(sizes), DIM, device=device)
    table_sizes = torch.tensor(sizes, dtype=torch.int64, device=device)
    row_offsets = torch.tensor([0, *sizes[:-1]], dtype=torch.int64, device=device).cumsum(0)
    ids = power_law_ids(batch, sizes).to(device)
    return weight, state, ids, grad, torch.tensor(LR, device=device), table_sizes, row_offsets, kind


def reference(weight, state, ids, grad, lr, table_sizes, row_offsets, kind):
    """The reference lookup, then its sparse update (float64 copies from the harness)."""
    out = ref.lookup(weight, ids, table_sizes, row_offsets)
    if kind == "lookup":
        return out
    ref.sparse_update_(weight, state, lr, grad, ids, table_sizes, row_offsets,
                       optimizer=embedding_optimizer(kind.removeprefix("update-"), eps=EPS))
    return out, weight, state


def eager_embedding(weight, state, ids, grad, lr, table_sizes, row_offsets, kind):
    """What a PyTorch user writes: index_select; torch.optim.Adagrad's sparse step on the COO gradient."""
    rows = (ids + row_offsets).view(-1)
    out = weight.index_select(0, rows).view(*ids.shape, weight.shape[1])
    if kind == "lookup":
        return out
    optimizer = kind.removeprefix("update-")
    coo = torch.sparse_coo_tensor(rows[None], grad.reshape(-1, weight.shape[1]), weight.shape,
                                  check_invariants=False).coalesce()
    index, values = coo.indices()[0], coo.values()
    if optimizer == "sgd":
        weight.index_add_(0, index, values, alpha=-float(lr))
        return out, weight, state
    if optimizer == "adagrad":
        state.index_add_(0, index, values * values)
        denom = state.index_select(0, index).sqrt_().add_(EPS)
    else:
        state.index_add_(0, index, (values * values).mean(dim=1))
        denom = state.index_select(0, index).sqrt_().add_(EPS)[:, None]
    weight.index_add_(0, index, values / denom, alpha=-float(lr))
    return out, weight, state


def compilable_embedding(weight, state, ids, grad, lr, table_sizes, row_offsets, kind):
    """Static shapes, no host sync (what torch.compile can take whole): the reference's sort + segment-sum update."""
    return reference(weight, state, ids, grad, lr, table_sizes, row_offsets, kind)


def fuselab_embedding(weight, state, ids, grad, lr, table_sizes, row_offsets, kind):
    from fuselab.ops.embedding import embedding_bag_lookup, embedding_bag_update_

    out = embedding_bag_lookup(weight, ids, table_sizes, row_offsets)
    if kind == "lookup":
        return out
    embedding_bag_update_(weight, state, lr, grad, ids, table_sizes, row_offsets,
                          optimizer=embedding_optimizer(kind.removeprefix("update-"), eps=EPS))
    return out, weight, state


SPEC = OpSpec(
    name="embedding",
    summary="embedding bag collection, Kaggle tables: lookup and lookup + fused sparse optimizer step",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        providers.eager(eager_embedding, description="index_select; sparse COO grad + coalesce + Adagrad index ops",
                        inplace=True),
        providers.compiled(compilable_embedding, description="torch.compile of the static-shape sort + index_add_ "
                           "segment sums + index_put_ update", inplace=True),
        providers.fuselab(fuselab_embedding, description="fuselab lookup kernel; rows + sort + segment/carry update "
                          "kernels", inplace=True),
    ),
)
