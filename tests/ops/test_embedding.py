"""EmbeddingBagCollection and its ops vs a float64 oracle written here (Python loops over id positions): lookup with
one id and with bags (sum, mean, empty bags), the modulus of raw and negative ids, the fused update of every
optimizer on batches with many duplicate rows (weights and state per element), two steps, determinism, eval and
no_grad, no gradient leaks, bad inputs, initialisation equal to the DLRM's torch collection, opcheck,
torch.compile(fullgraph=True).

The Triton kernels run under the interpreter on CPU (small shapes, small blocks so that runs cross many chunks).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch

import fuselab.ops
from fuselab.core.embedding_optimizer import EMBEDDING_OPTIMIZERS, SGD, Adagrad, RowwiseAdagrad, embedding_optimizer
from fuselab.dlrm.sparse import TableSpec, TorchEmbeddingCollection
from fuselab.ops.embedding import (
    EmbeddingBagCollection,
    EmbeddingConfig,
    embedding_bag_collection,
    embedding_bag_lookup,
    embedding_bag_update_,
    launch,
)
from fuselab.reference import embedding as ref
from fuselab.testing import assert_close

#: small blocks: a batch of a few hundred ids spans many chunks (8-16 positions at the tests' dims), and runs of one
#: row cross several of them (the carry kernel adds 1-2 chunks per step)
# update chunks of 2-4 steps: runs continue across steps inside a chunk and across chunks (one id per feature at
# the tests' dims: the segment kernel; bags: the items)
SMALL = EmbeddingConfig(lookup_elements=64, update_elements=64, rows_block=64, carry_elements=8, num_warps=1,
                        update_chunk=32, segment_elements=64)
#: the same, one id per feature summed by items too
ITEMS = dataclasses.replace(SMALL, segment_dim=0)
SIZES = [1, 3, 40, 7, 1000]  # tiny tables: many duplicates (every id of table 0 is row 0)
OPTIMIZERS = tuple(EMBEDDING_OPTIMIZERS)
ATOL, RTOL = 2e-6, 1e-5


#: the ``triton_backend`` fixture without its default-device context: every test here places its tensors itself
#: (oracle data on the CPU, ``.to(device)`` for the kernels)
PLACES_ITS_TENSORS = True


def _starts(sizes: list[int]) -> list[int]:
    out, acc = [], 0
    for n in sizes:
        out.append(acc)
        acc += n
    return out


def _meta(sizes: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(sizes, dtype=torch.int64, device=device),
            torch.tensor(_starts(sizes), dtype=torch.int64, device=device))


def _positions(ids: torch.Tensor, sizes: list[int], offsets: torch.Tensor | None, pooling: str = "sum"):
    """Oracle: (global row, bag, scale) of every id position, with Python's non-negative modulus."""
    starts, f_count, out = _starts(sizes), len(sizes), []
    if offsets is None:
        for b, row_ids in enumerate(ids.tolist()):
            for f, raw in enumerate(row_ids):
                out.append((starts[f] + raw % sizes[f], b * f_count + f, 1.0))
        return out
    offs, flat = offsets.tolist(), ids.tolist()
    for j in range(len(offs) - 1):
        f, n = j % f_count, offs[j + 1] - offs[j]
        for k in range(offs[j], offs[j + 1]):
            out.append((starts[f] + flat[k] % sizes[f], j, 1.0 / n if pooling == "mean" else 1.0))
    return out


def _oracle_lookup(w64: torch.Tensor, positions, num_bags: int) -> torch.Tensor:
    out = torch.zeros(num_bags, w64.shape[1], dtype=torch.float64)
    for row, bag, scale in positions:
        out[bag] += w64[row] * scale
    return out


def _oracle_update(w64, s64, lr: float, g64, positions, optimizer: str, eps: float) -> None:
    """torch.optim semantics on the coalesced gradient of each touched row, in float64, in place."""
    total: dict[int, torch.Tensor] = {}
    for row, bag, scale in positions:
        total[row] = total.get(row, 0.0) + g64[bag] * scale
    for row, g in total.items():
        if optimizer == "sgd":
            w64[row] -= lr * g
        elif optimizer == "adagrad":
            s64[row] += g * g
            w64[row] -= lr * g / (s64[row].sqrt() + eps)
        else:
            s64[row] += (g * g).mean()
            w64[row] -= lr * g / (s64[row].sqrt() + eps)


def _close(out: torch.Tensor, expect: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(out.double().cpu(), expect, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def _bags(batch: int, f_count: int, max_len: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR bags with lengths 0..max_len (some empty) and raw ids of both signs."""
    lengths = torch.randint(0, max_len + 1, (batch * f_count,), generator=gen)
    lengths[::5] = 0
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=lengths.device), lengths.cumsum(0)])
    ids = torch.randint(-(2**40), 2**40, (int(offsets[-1]),), generator=gen)
    return ids.to(device), offsets.to(device)


# ---------------------------------------------------------------------------------------------- lookup
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_lookup_one_id(backend, device, id_dtype):
    gen = torch.Generator().manual_seed(1)
    sizes, batch, dim = SIZES, 13, 5
    w = torch.randn(sum(sizes), dim, generator=gen)
    high = 2**40 if id_dtype == torch.int64 else 2**31 - 1
    ids = torch.randint(-high, high, (batch, len(sizes)), generator=gen, dtype=torch.int64).to(id_dtype)
    ids[0] = torch.tensor([0, -1, 39, 7, -1000])  # boundaries of the modulus
    table_sizes, row_offsets = _meta(sizes, device)
    expect = _oracle_lookup(w.double(), _positions(ids, sizes, None), batch * len(sizes)).view(batch, -1, dim)
    out = embedding_bag_lookup(w.to(device), ids.to(device), table_sizes, row_offsets, config=SMALL)
    assert out.shape == (batch, len(sizes), dim) and out.dtype == torch.float32
    assert torch.equal(out.cpu().double(), expect)  # a lookup copies rows: exact


def test_lookup_strided_ids_poisoned_out(triton_backend, device):
    gen = torch.Generator().manual_seed(2)
    sizes, batch, dim = [5, 9, 33], 11, 16
    w = torch.randn(sum(sizes), dim, generator=gen)
    ids = torch.randint(-99, 99, (len(sizes), batch), generator=gen).t()  # (B, F) with strides (1, B)
    table_sizes, row_offsets = _meta(sizes, device)
    out = torch.full((batch, len(sizes), dim), float("nan"), device=device)
    launch.lookup_(out, w.to(device), ids.to(device), table_sizes, row_offsets, None, "sum", SMALL)
    expect = _oracle_lookup(w.double(), _positions(ids, sizes, None), batch * len(sizes)).view(batch, -1, dim)
    assert torch.equal(out.cpu().double(), expect)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_lookup_bags(backend, device, pooling):
    gen = torch.Generator().manual_seed(3)
    sizes, batch, dim = SIZES, 6, 7
    w = torch.randn(sum(sizes), dim, generator=gen)
    ids, offsets = _bags(batch, len(sizes), 4, gen, device)
    table_sizes, row_offsets = _meta(sizes, device)
    expect = _oracle_lookup(w.double(), _positions(ids.cpu(), sizes, offsets.cpu(), pooling), batch * len(sizes))
    out = embedding_bag_lookup(w.to(device), ids, table_sizes, row_offsets, offsets, pooling=pooling, config=SMALL)
    assert out.shape == (batch, len(sizes), dim)
    _close(out.reshape(-1, dim), expect, f"{pooling} bags")
    empty = (offsets[1:] == offsets[:-1]).cpu()
    assert empty.any() and torch.equal(out.reshape(-1, dim)[empty.to(device)].cpu(), torch.zeros(int(empty.sum()), dim))


def test_lookup_bags_poisoned_out(triton_backend, device):
    gen = torch.Generator().manual_seed(4)
    sizes, batch, dim = [2, 50], 9, 3
    w = torch.randn(sum(sizes), dim, generator=gen)
    ids, offsets = _bags(batch, len(sizes), 3, gen, device)
    out = torch.full((batch, len(sizes), dim), float("nan"), device=device)
    launch.lookup_(out, w.to(device), ids, *_meta(sizes, device), offsets, "mean", SMALL)
    expect = _oracle_lookup(w.double(), _positions(ids.cpu(), sizes, offsets.cpu(), "mean"), batch * len(sizes))
    _close(out.reshape(-1, dim), expect, "poisoned mean bags")


# ---------------------------------------------------------------------------------------------- update
def _update_case(optimizer: str, bags: bool, pooling: str, device, seed: int = 5, batch: int = 40):
    gen = torch.Generator().manual_seed(seed)
    sizes, dim = SIZES, 6
    w = torch.randn(sum(sizes), dim, generator=gen)
    state = torch.rand(embedding_optimizer(optimizer).state_shape(w.shape[0], dim), generator=gen)
    if bags:
        ids, offsets = _bags(batch, len(sizes), 3, gen, device)
    else:
        ids, offsets = torch.randint(-(2**40), 2**40, (batch, len(sizes)), generator=gen).to(device), None
    grad = torch.randn(batch, len(sizes), dim, generator=gen)
    return sizes, w, state, ids, offsets, grad


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("layout", ["one_id", "one_id_items", "sum_bags", "mean_bags"])
def test_fused_update(backend, device, optimizer, layout):
    bags, pooling = not layout.startswith("one_id"), "mean" if layout == "mean_bags" else "sum"
    sizes, w, state, ids, offsets, grad = _update_case(optimizer, bags, pooling, device)
    lr, eps = 0.3, 1e-8
    w64, s64 = w.double(), state.double()
    positions = _positions(ids.cpu(), sizes, None if offsets is None else offsets.cpu(), pooling)
    assert len({p[0] for p in positions}) < len(positions) // 2  # many duplicates
    _oracle_update(w64, s64, lr, grad.double().view(-1, w.shape[1]), positions, optimizer, eps)
    w_dev, s_dev = w.to(device), state.to(device)
    embedding_bag_update_(w_dev, s_dev, torch.tensor(lr, device=device), grad.to(device), ids, *_meta(sizes, device),
                          offsets, pooling=pooling, optimizer=embedding_optimizer(optimizer, eps=eps),
                          config=ITEMS if layout == "one_id_items" else SMALL)
    _close(w_dev, w64, f"{optimizer} weight")
    if optimizer != "sgd":
        _close(s_dev, s64, f"{optimizer} state")
    touched = {p[0] for p in positions}
    untouched = torch.tensor([r not in touched for r in range(w.shape[0])])
    assert torch.equal(w_dev.cpu()[untouched], w[untouched])  # rows no id touched keep their bits


@pytest.mark.parametrize("config", [SMALL, ITEMS], ids=["segments", "items"])
def test_update_long_runs_cross_many_chunks(triton_backend, device, config):
    """One row takes 150 positions: its run crosses ~10 chunks of 32, summed by the carry kernel in steps of 2."""
    sizes, dim, batch = [1, 2], 4, 150
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(3, dim, generator=gen)
    state = torch.zeros(3)
    ids = torch.randint(0, 100, (batch, 2), generator=gen)
    grad = torch.randn(batch, 2, dim, generator=gen)
    w64, s64 = w.double(), state.double()
    _oracle_update(w64, s64, 0.1, grad.double().view(-1, dim), _positions(ids, sizes, None), "rowwise_adagrad", 1e-8)
    w_dev, s_dev = w.to(device), state.to(device)
    embedding_bag_update_(w_dev, s_dev, torch.tensor(0.1, device=device), grad.to(device), ids.to(device),
                          *_meta(sizes, device), config=config)
    _close(w_dev, w64, "weight")
    _close(s_dev, s64, "state")


def test_atomic_sgd(triton_backend, device):
    sizes, w, _, ids, offsets, grad = _update_case("sgd", True, "mean", device, seed=7)
    w64 = w.double()
    _oracle_update(w64, None, 0.5, grad.double().view(-1, w.shape[1]), _positions(ids.cpu(), sizes, offsets.cpu(),
                                                                                    "mean"), "sgd", 0.0)
    w_dev = w.to(device)
    embedding_bag_update_(w_dev, torch.empty(0, device=device), torch.tensor(0.5, device=device), grad.to(device), ids,
                          *_meta(sizes, device), offsets, pooling="mean", optimizer=SGD(), deterministic=False,
                          config=SMALL)
    _close(w_dev, w64, "atomic sgd weight")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_deterministic_bits(triton_backend, device, optimizer):
    sizes, w, state, ids, _, grad = _update_case(optimizer, False, "sum", device, seed=8)
    results = []
    for _ in range(2):
        w_dev, s_dev = w.to(device), state.to(device)
        embedding_bag_update_(w_dev, s_dev, torch.tensor(0.2, device=device), grad.to(device), ids,
                              *_meta(sizes, device), optimizer=embedding_optimizer(optimizer), config=SMALL)
        results.append((w_dev, s_dev))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# ---------------------------------------------------------------------------------------------- module
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_module_two_steps(backend, device, optimizer):
    sizes, dim, batch = SIZES, 4, 24
    m = EmbeddingBagCollection(sizes, dim, optimizer=embedding_optimizer(optimizer), lr=0.05, device=device,
                               generator=torch.Generator().manual_seed(0), config=SMALL)
    w64, s64 = m.weight.double().cpu(), m.state.double().cpu()
    gen = torch.Generator().manual_seed(9)
    for step in range(2):
        lr = 0.05 if step == 0 else 0.02
        m.set_lr(lr)
        ids = torch.randint(-500, 500, (batch, len(sizes)), generator=gen)
        upstream = torch.randn(batch, len(sizes), dim, generator=gen)
        out = m(ids.to(device))
        _close(out, _oracle_lookup(w64, _positions(ids, sizes, None), batch * len(sizes)).view(batch, -1, dim),
               "lookup")
        (out * upstream.to(device)).sum().backward()
        _oracle_update(w64, s64, lr, upstream.double().view(-1, dim), _positions(ids, sizes, None), optimizer, 1e-8)
        _close(m.weight, w64, f"weight after step {step}")
        if optimizer != "sgd":
            _close(m.state, s64, f"state after step {step}")
    assert not m.weight.requires_grad and m.weight.grad is None and m.grad_anchor.grad is None


def test_module_bags(backend, device):
    sizes, dim, batch = [4, 30], 3, 10
    m = EmbeddingBagCollection(sizes, dim, pooling="mean", optimizer=Adagrad(), lr=0.1, device=device,
                               generator=torch.Generator().manual_seed(1), config=SMALL)
    w64, s64 = m.weight.double().cpu(), m.state.double().cpu()
    gen = torch.Generator().manual_seed(10)
    ids, offsets = _bags(batch, len(sizes), 3, gen, device)
    upstream = torch.randn(batch, len(sizes), dim, generator=gen)
    m(ids, offsets).backward(upstream.to(device))
    _oracle_update(w64, s64, 0.1, upstream.double().view(-1, dim), _positions(ids.cpu(), sizes, offsets.cpu(), "mean"),
                   "adagrad", 1e-8)
    _close(m.weight, w64, "weight")
    _close(m.state, s64, "state")


def test_eval_and_no_grad_do_not_update(backend, device):
    m = EmbeddingBagCollection([5, 6], 4, device=device, config=SMALL)
    before = (m.weight.clone(), m.state.clone())
    ids = torch.randint(0, 30, (8, 2), device=device)
    with torch.no_grad():
        out = m(ids)
    assert not out.requires_grad
    m.eval()
    out = m(ids)
    assert not out.requires_grad
    m.train()
    out = m(ids)
    assert out.requires_grad
    assert torch.equal(m.weight, before[0]) and torch.equal(m.state, before[1])
    out.sum().backward()
    assert not torch.equal(m.weight, before[0])


def test_init_matches_the_torch_collection():
    sizes, dim = [3, 17, 100, 1], 8
    arch = TorchEmbeddingCollection(TableSpec(sizes, dim), generator=torch.Generator().manual_seed(42))
    m = EmbeddingBagCollection(sizes, dim, generator=torch.Generator().manual_seed(42))
    assert torch.equal(m.weight, arch.weight)
    assert torch.equal(m.row_offsets, arch.row_offsets)
    assert m.table_sizes.tolist() == sizes and m.lr.dim() == 0 and m.lr.dtype == torch.float32
    assert m.state.shape == (sum(sizes),) and not m.state.any()
    assert EmbeddingBagCollection(sizes, dim, optimizer=Adagrad()).state.shape == (sum(sizes), dim)
    assert EmbeddingBagCollection(sizes, dim, optimizer=SGD()).state.numel() == 0


# ---------------------------------------------------------------------------------------------- errors
def _valid(device="cpu"):
    w = torch.randn(10, 4, device=device)
    sizes, starts = _meta([4, 6], device)
    return w, torch.zeros(3, 2, dtype=torch.int64, device=device), sizes, starts


@dataclasses.dataclass(frozen=True)
class _Unfused(RowwiseAdagrad):
    """A kind the kernels do not implement (row-wise Adagrad's math under another name)."""

    name: ClassVar[str] = "unfused"


def test_an_optimizer_without_kernel_runs_on_the_reference_path(torch_backend, monkeypatch):
    """A registered kind the kernels do not implement (the custom ops carry an optimizer by its registered name)."""
    monkeypatch.setitem(EMBEDDING_OPTIMIZERS, _Unfused.name, _Unfused)
    w, ids, sizes, starts = _valid()
    state, lr, grad = torch.zeros(10), torch.tensor(0.1), torch.randn(3, 2, 4)
    expect_w, expect_s = w.clone(), state.clone()
    ref.sparse_update_(expect_w, expect_s, lr, grad, ids, sizes, starts, optimizer=RowwiseAdagrad())
    embedding_bag_update_(w, state, lr, grad, ids, sizes, starts, optimizer=_Unfused())
    assert torch.equal(w, expect_w) and torch.equal(state, expect_s) and not torch.equal(state, torch.zeros(10))


def test_an_optimizer_without_kernel_is_named_on_the_triton_path(triton_backend, device):
    w, ids, sizes, starts = _valid(device)
    state, lr, grad = (torch.zeros(10, device=device), torch.tensor(0.1, device=device),
                       torch.randn(3, 2, 4, device=device))
    with pytest.raises(ValueError, match="optimizer 'unfused' has no fused kernel"):
        embedding_bag_update_(w, state, lr, grad, ids, sizes, starts, optimizer=_Unfused())


@pytest.mark.parametrize("kw, match", [
    (dict(table_sizes=[3, -1]), "table_sizes"), (dict(table_sizes=[]), "table_sizes"), (dict(dim=0), "dim"),
    (dict(optimizer="adagrad"), "optimizer must be an EmbeddingOptimizer"), (dict(pooling="max"), "pooling"),
    (dict(lr=-0.1), "lr"),
])
def test_module_errors(kw, match):
    args = {"table_sizes": [3, 4], "dim": 4, **kw}
    with pytest.raises(TypeError if "optimizer" in kw else ValueError, match=match):
        EmbeddingBagCollection(args.pop("table_sizes"), args.pop("dim"), **args)


def test_config_errors():
    with pytest.raises(ValueError, match="update_elements"):
        EmbeddingConfig(update_elements=12)
    with pytest.raises(ValueError, match="segment_dim must be a positive power of two or 0"):
        EmbeddingConfig(segment_dim=24)
    assert EmbeddingConfig(segment_dim=0).segment_dim == 0
    with pytest.raises(TypeError, match="config"):
        embedding_bag_lookup(*_valid(), config={"update_elements": 16})
    assert launch.blocks(16) == launch.Blocks(block_d=16, lookup_rows=256, bag_rows=64, update_items=8,
                                              carry_chunks=256)
    assert launch.blocks(128) == launch.Blocks(block_d=128, lookup_rows=32, bag_rows=8, update_items=1,
                                               carry_chunks=32)
    assert launch.blocks(100) == launch.blocks(128)


# ---------------------------------------------------------------------------------------------- torch.library
def test_opcheck(backend, device):
    w, ids, sizes, starts = _valid(device)
    ids = torch.tensor([[1, -3], [7, 2], [1, 5]], device=device)
    state, lr, grad = torch.zeros(10, device=device), torch.tensor(0.1, device=device), torch.randn(3, 2, 4,
                                                                                                     device=device)
    offsets = torch.tensor([0, 2, 2, 3, 5, 5, 6], device=device)
    flat = torch.tensor([3, -1, 4, 1, 5, 9], device=device)
    torch.library.opcheck(torch.ops.fuselab.embedding_bag_lookup.default, (w, ids, None, sizes, starts, "sum", []))
    torch.library.opcheck(torch.ops.fuselab.embedding_bag_lookup.default,
                          (w, flat, offsets, sizes, starts, "mean", []))
    torch.library.opcheck(torch.ops.fuselab.embedding_bag_update_.default,
                          (w, state, None, lr, grad, ids, None, sizes, starts, "sum", "rowwise_adagrad", 1e-8, True,
                           []))
    anchor = torch.empty(0, device=device, requires_grad=True)
    for optimizer in ("sgd", "rowwise_adagrad"):
        torch.library.opcheck(torch.ops.fuselab.embedding_bag_train.default,
                              (anchor, w, state, None, lr, ids, None, sizes, starts, "sum", optimizer, 1e-8, True, []))


def test_compile_fullgraph(backend, device):
    """torch.compile(fullgraph=True) of the module: forward and the fused update of its backward equal eager."""
    sizes, dim = [3, 50, 7], 4
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        m = EmbeddingBagCollection(sizes, dim, device=device, generator=torch.Generator().manual_seed(2), config=SMALL)
        run = torch.compile(m, fullgraph=True) if compiled else m
        gen = torch.Generator().manual_seed(3)
        for _ in range(2):
            ids = torch.randint(-100, 100, (12, len(sizes)), generator=gen).to(device)
            out = run(ids)
            (out * out).sum().backward()
        results.append((out.detach(), m.weight.clone(), m.state.clone()))
    (out0, w0, s0), (out1, w1, s1) = results
    start = EmbeddingBagCollection(sizes, dim, generator=torch.Generator().manual_seed(2)).weight
    assert not torch.equal(w0.cpu(), start)  # the steps did update
    _close(out1, out0.double().cpu(), "compiled output")
    _close(w1, w0.double().cpu(), "compiled weight")
    _close(s1, s0.double().cpu(), "compiled state")


def test_functional_collection_anchor(backend, device):
    """Without an anchor that requires grad the functional API is a plain lookup (no autograd edge)."""
    w, ids, sizes, starts = _valid(device)
    state, lr = torch.zeros(10, device=device), torch.tensor(0.1, device=device)
    assert not embedding_bag_collection(w, state, lr, ids, sizes, starts).requires_grad
    anchor = torch.empty(0, device=device, requires_grad=True)
    out = embedding_bag_collection(w, state, lr, ids, sizes, starts, anchor=anchor, config=SMALL)
    assert out.requires_grad
    before = w.clone()
    out.sum().backward()
    assert anchor.grad is None and not torch.equal(w, before)


@pytest.mark.big_memory
@pytest.mark.gpu
def test_rows_past_int32_offsets(device):
    """R*D > 2^31: row addresses must be int64 (8.6 GB of weight)."""
    dim, rows = 16, 2**31 // 16 + 1024
    m = EmbeddingBagCollection([rows], dim, optimizer=SGD(), lr=1.0, device=device)
    ids = torch.tensor([[rows - 1], [rows - 2], [3]], device=device)
    out = m(ids)
    assert torch.equal(out[:, 0], m.weight[ids[:, 0]])
    before = m.weight[ids[:, 0]].clone()
    out.sum().backward()
    assert torch.equal(m.weight[ids[:, 0]], before - 1.0)


@pytest.mark.parametrize("bags", [False, True])
def test_int64_position_math(triton_backend, device, monkeypatch, request, bags):
    """The WIDE variants (position math in int64, chosen when an offset may pass 2^31) give the same results."""
    monkeypatch.setattr(launch, "needs_int64", lambda *tensors: True)
    fuselab.ops.clear()  # no launch kept by an earlier test: every call plans (and so reaches needs_int64)
    request.addfinalizer(fuselab.ops.clear)  # nor a kept WIDE launch for later tests
    sizes, w, state, ids, offsets, grad = _update_case("adagrad", bags, "mean", device, seed=11, batch=12)
    pooling = "mean"
    positions = _positions(ids.cpu(), sizes, None if offsets is None else offsets.cpu(), pooling)
    table_sizes, row_offsets = _meta(sizes, device)
    out = embedding_bag_lookup(w.to(device), ids, table_sizes, row_offsets, offsets, pooling=pooling, config=SMALL)
    _close(out.reshape(-1, w.shape[1]), _oracle_lookup(w.double(), positions, grad.shape[0] * len(sizes)), "lookup")
    w64, s64 = w.double(), state.double()
    _oracle_update(w64, s64, 0.1, grad.double().view(-1, w.shape[1]), positions, "adagrad", 1e-8)
    w_dev, s_dev = w.to(device), state.to(device)
    embedding_bag_update_(w_dev, s_dev, torch.tensor(0.1, device=device), grad.to(device), ids, table_sizes,
                          row_offsets, offsets, pooling=pooling, optimizer=Adagrad(), config=SMALL)
    _close(w_dev, w64, "weight")
    _close(s_dev, s64, "state")


# ---------------------------------------------------------------------------------------------- bench suite
def test_bench_suite(device):
    """The suite's cases, cost model and providers: every provider agrees with the float64 reference on the CPU
    cases (fuselab through the kernels under the interpreter; torch.compile on one case, it compiles slowly)."""
    from fuselab.backend import forced
    from fuselab.bench.check import check
    from fuselab.bench.spec import CaseQuery
    from fuselab.bench.suites import embedding as suite
    from fuselab.bench.suites import get_spec

    spec = get_spec("embedding")
    gpu = spec.cases(CaseQuery("cuda"))
    assert {c.params["batch"] for c in gpu} == {65536, 8192} and sum(gpu[0].params["sizes"]) > 33_000_000
    lookup = next(c for c in gpu if c.params["kind"] == "lookup" and c.params["batch"] == 65536)
    assert lookup.bytes == 65536 * 26 * (8 + 2 * 64)
    assert not spec.cases(CaseQuery("cpu", modes=("fwd+bwd",)))
    ids = suite.power_law_ids(4096, (1000,))
    assert ids.min() >= 0 and ids.max() < 1000 and ids.unique().numel() < 1000  # power law: duplicates
    for case in spec.cases(CaseQuery("cpu")):
        for p in spec.providers:
            if p.name == "torch.compile" and case.params["kind"] != "update-rowwise_adagrad":
                continue
            with forced("triton" if p.triton else "auto"):
                result = check(spec, case, p.build(case), device=device)
            assert result.ok, f"{p.name} {case.key}: {result.error:.2e}"


@pytest.mark.gpu
def test_cuda_graph_step(device):
    """Forward + fused update captured in one CUDA graph (no host sync anywhere) equals the same steps in eager."""
    sizes, dim, batch = [3, 1000, 50_000], 16, 4096
    gen = torch.Generator().manual_seed(12)
    ids = [torch.randint(0, 10**6, (batch, len(sizes)), generator=gen).to(device) for _ in range(3)]
    upstream = torch.randn(batch, len(sizes), dim, generator=gen).to(device)
    eager = EmbeddingBagCollection(sizes, dim, device=device, generator=torch.Generator().manual_seed(0))
    graphed = EmbeddingBagCollection(sizes, dim, device=device, generator=torch.Generator().manual_seed(0))
    static_ids = ids[0].clone()

    def step(module, batch_ids):
        (module(batch_ids) * upstream).sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels) on a copy, then capture
        step(EmbeddingBagCollection(sizes, dim, device=device), static_ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(graphed, static_ids)
    for batch_ids in ids:
        static_ids.copy_(batch_ids)
        graph.replay()
        step(eager, batch_ids)
    torch.cuda.synchronize()
    assert torch.equal(graphed.weight, eager.weight) and torch.equal(graphed.state, eager.state)


def test_state_dict_round_trip(backend, device):
    """Checkpoints keep the tables and the optimizer state; a restored module continues identically."""
    sizes, dim = [3, 20], 4
    a = EmbeddingBagCollection(sizes, dim, device=device, generator=torch.Generator().manual_seed(5), config=SMALL)
    ids = torch.randint(0, 50, (8, 2), device=device)
    a(ids).sum().backward()
    state = a.state_dict()
    assert {"weight", "state"} <= set(state) and "lr" not in state
    b = EmbeddingBagCollection(sizes, dim, device=device, generator=torch.Generator().manual_seed(6), config=SMALL)
    b.load_state_dict(state)
    for m in (a, b):
        m(ids).sum().backward()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.state, b.state)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_matches_torch_optim_on_sparse_gradients(backend, device, optimizer):
    """Two steps of the module equal F.embedding(sparse=True) + torch.optim.SGD / Adagrad (the DLRM's torch path)."""
    sizes, dim, batch, lr, eps = [2, 30, 500], 8, 32, 0.05, 1e-10
    gen = torch.Generator().manual_seed(13)
    m = EmbeddingBagCollection(sizes, dim, optimizer=embedding_optimizer(optimizer, eps=eps), lr=lr, device=device,
                               generator=torch.Generator().manual_seed(4), config=SMALL)
    weight = torch.nn.Parameter(m.weight.detach().cpu().clone())
    opt = (torch.optim.SGD([weight], lr=lr) if optimizer == "sgd"
           else torch.optim.Adagrad([weight], lr=lr, eps=eps))
    starts = torch.tensor(_starts(sizes))
    for _ in range(2):
        ids = torch.randint(0, 10**6, (batch, len(sizes)), generator=gen)
        upstream = torch.randn(batch, len(sizes), dim, generator=gen)
        (m(ids.to(device)) * upstream.to(device)).sum().backward()
        rows = ids % torch.tensor(sizes) + starts
        opt.zero_grad()
        (torch.nn.functional.embedding(rows, weight, sparse=True) * upstream).sum().backward()
        opt.step()
    torch.testing.assert_close(m.weight.cpu(), weight.detach(), atol=1e-6, rtol=1e-5)
    if optimizer == "adagrad":
        torch.testing.assert_close(m.state.cpu(), opt.state[weight]["sum"], atol=1e-6, rtol=1e-5)


@pytest.mark.big_memory
@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_kaggle_scale_update(device, optimizer):
    """Kaggle tables (33.8M rows), B=65536 power-law ids (runs of ~20k positions in the 3-row table cross ~170
    chunks): lookup and fused update vs the float64 reference, every touched row per element."""
    from fuselab.bench.suites import embedding as suite

    sizes, dim, batch = suite.KAGGLE_CARDINALITIES, 16, 65536
    ids = suite.power_law_ids(batch, sizes).to(device)
    table_sizes, row_offsets = _meta(list(sizes), device)
    gen = torch.Generator(device=device).manual_seed(0)
    w = torch.rand(sum(sizes), dim, device=device, generator=gen) - 0.5
    state = torch.rand(embedding_optimizer(optimizer).state_shape(w.shape[0], dim), device=device, generator=gen)
    grad = torch.randn(batch, len(sizes), dim, device=device, generator=gen)
    lr = torch.tensor(0.01, device=device)
    keys, pos_grads = ref.position_grads(grad, ids, table_sizes, row_offsets, None, "sum")
    rows, inverse = torch.unique(keys, return_inverse=True)
    expect_out = ref.lookup(w.double(), ids, table_sizes, row_offsets)
    out = embedding_bag_lookup(w, ids, table_sizes, row_offsets)
    assert torch.equal(out.double(), expect_out)
    full64 = w.double()
    state64 = state.double()
    ref.sparse_update_(full64, state64, lr.double(), grad.double(), ids, table_sizes, row_offsets,
                       optimizer=embedding_optimizer(optimizer))
    embedding_bag_update_(w, state, lr, grad, ids, table_sizes, row_offsets, optimizer=embedding_optimizer(optimizer))
    # the kernel sums a row's gradients in fp32 (a scan per chunk, then the chunk partials: an addition tree of
    # depth < 32), so each summed element may be off by 32 ulp of sum(|g|); carry that through each update
    g_abs = torch.zeros(len(rows), dim, dtype=torch.float64, device=device).index_add_(0, inverse,
                                                                                        pos_grads.double().abs())
    g64 = torch.zeros_like(g_abs).index_add_(0, inverse, pos_grads.double())
    dg = 32 * 2.0**-24 * g_abs
    lr64 = float(lr)
    if optimizer == "sgd":
        bound_w = lr64 * dg
    else:
        ds = 2 * g64.abs() * dg + dg * dg
        if optimizer == "rowwise_adagrad":
            ds = ds.mean(dim=1, keepdim=True)
        s64 = state64[rows].reshape(len(rows), -1)
        root = s64.sqrt() + 1e-8
        bound_w = lr64 * (dg / root + g64.abs() * ds / (2 * s64 * root))
        state_err = (state[rows].double().reshape(len(rows), -1) - s64).abs()
        assert torch.all(state_err <= ATOL + RTOL * s64.abs() + ds), "optimizer state off beyond fp32 summation"
    w_err = (w[rows].double() - full64[rows]).abs()
    assert torch.all(w_err <= ATOL + RTOL * full64[rows].abs() + bound_w), "weights off beyond fp32 summation"


def test_strided_offsets_and_grad(backend, device):
    """Strided offsets, table metadata and output gradient give the same results as contiguous ones."""
    sizes, dim, batch = [3, 40], 4, 7
    gen = torch.Generator().manual_seed(14)
    ids, offsets = _bags(batch, len(sizes), 3, gen, device)
    table_sizes, row_offsets = _meta(sizes, device)
    strided = [torch.stack([t, t], dim=1)[:, 0] for t in (offsets, table_sizes, row_offsets)]
    assert not strided[0].is_contiguous()
    w = torch.randn(sum(sizes), dim, generator=gen).to(device)
    grad = torch.randn(dim, len(sizes), batch, generator=gen).to(device).permute(2, 1, 0)  # (B, F, D), D stride B*F
    expect = embedding_bag_lookup(w, ids, table_sizes, row_offsets, offsets, pooling="mean", config=SMALL)
    out = embedding_bag_lookup(w, ids, strided[1], strided[2], strided[0], pooling="mean", config=SMALL)
    assert torch.equal(out, expect)
    results = []
    cases = (((table_sizes, row_offsets, offsets), grad.contiguous()), ((strided[1], strided[2], strided[0]), grad))
    for args, g in cases:
        w2, s2 = w.clone(), torch.zeros(w.shape[0], device=device)
        embedding_bag_update_(w2, s2, torch.tensor(0.1, device=device), g, ids, *args, pooling="mean", config=SMALL)
        results.append((w2, s2))
    # the same sums of the same rows; a strided gradient may take another load width on a GPU (fp32 order)
    for a, b, what in zip(results[0], results[1], ("weight", "state")):
        assert_close(b, a, torch.float32, f"strided-case {what}")
    assert not torch.equal(results[0][0], w)


def test_init_ignores_default_device_context():
    """The rows are drawn on the generator's device even inside ``with torch.device(...)`` (a CPU generator with a
    CUDA default device failed on the GPU): the same bits as outside the context."""
    want = EmbeddingBagCollection([3, 5], 4, generator=torch.Generator().manual_seed(4)).weight
    with torch.device("meta"):
        got = EmbeddingBagCollection([3, 5], 4, device="cpu", generator=torch.Generator().manual_seed(4)).weight
    assert got.device.type == "cpu" and torch.equal(got, want)
