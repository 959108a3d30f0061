"""Half-precision embedding tables (fp16, bf16): fp32 lookups, fp32 update math, stochastic rounding of the stored
weight (unbiased, seeded, reproducible), against float64 references written here."""

from __future__ import annotations

import math

import pytest
import torch

from fuselab.core.embedding_optimizer import SGD
from fuselab.ops.embedding import EmbeddingConfig, embedding_bag_lookup, embedding_bag_update_
from fuselab.ops.embedding.module import EmbeddingBagCollection

PLACES_ITS_TENSORS = True
HALF = (torch.bfloat16, torch.float16)
SMALL = EmbeddingConfig(lookup_elements=64, update_elements=64, rows_block=64, carry_elements=8, num_warps=1,
                        update_chunk=32)


@pytest.fixture(autouse=True)
def _kernels(triton_backend):
    """Every test here runs the Triton kernels (the interpreter on CPU)."""


def _meta(sizes, device):
    starts = torch.tensor([0, *sizes[:-1]]).cumsum(0)
    return torch.tensor(sizes, device=device), starts.to(device)


def _ulp(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each value of float64 ``r`` (its last place)."""
    e = torch.floor(torch.log2(r.abs().clamp(min=1e-300)))
    if dtype == torch.bfloat16:
        return torch.exp2(e.clamp(min=-126) - 7)
    return torch.exp2(e.clamp(min=-14) - 10)


def _rowwise_adagrad64(w, s, lr, g_rows, rows, eps):
    """Float64 row-wise Adagrad of the coalesced gradients ``g_rows`` (one per distinct row in ``rows``)."""
    s = s.clone()
    w = w.clone()
    s[rows] += (g_rows * g_rows).mean(dim=1)
    w[rows] -= lr * g_rows / (s[rows].sqrt()[:, None] + eps)
    return w, s


def _one_id_batch(sizes, batch, gen):
    return torch.stack([torch.randint(0, n, (batch,), generator=gen) for n in sizes], dim=1)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("bags", [False, True])
def test_half_lookup_is_fp32_sum_of_rows(device, dtype, bags):
    """A half weight is read as its exact values: the fp32 output equals the float64 sum of the rows."""
    gen = torch.Generator().manual_seed(1)
    sizes, batch, dim = [7, 30, 5], 9, 24
    w = torch.randn(sum(sizes), dim, generator=gen).to(dtype)
    table_sizes, starts = _meta(sizes, device)
    if bags:
        lengths = torch.randint(0, 4, (batch * len(sizes),), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        ids = torch.randint(0, 1000, (int(offsets[-1]),), generator=gen)
        feature = torch.repeat_interleave(torch.arange(batch * len(sizes)) % len(sizes), lengths)
        bag = torch.repeat_interleave(torch.arange(batch * len(sizes)), lengths)
        rows = starts.cpu()[feature] + ids % torch.tensor(sizes)[feature]
        expect = torch.zeros(batch * len(sizes), dim, dtype=torch.float64).index_add_(0, bag, w.double()[rows])
        out = embedding_bag_lookup(w.to(device), ids.to(device), table_sizes, starts, offsets.to(device),
                                   config=SMALL)
    else:
        ids = _one_id_batch(sizes, batch, gen)
        expect = w.double()[starts.cpu() + ids]
        out = embedding_bag_lookup(w.to(device), ids.to(device), table_sizes, starts, config=SMALL)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double().reshape(expect.shape), expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", HALF)
def test_half_update_lands_on_a_neighbour_of_the_exact_update(device, dtype):
    """Row-wise Adagrad on a half weight: the state (fp32) is the float64 reference's; every stored weight is one of
    the two values of ``dtype`` around the float64 update (less than one last place away), duplicates summed."""
    gen = torch.Generator().manual_seed(2)
    sizes, batch, dim = [3, 40], 50, 12
    w = (torch.randn(sum(sizes), dim, generator=gen) * 0.1).to(dtype)
    s = torch.rand(sum(sizes), generator=gen)
    ids = _one_id_batch(sizes, batch, gen)
    grad = torch.randn(batch, len(sizes), dim, generator=gen)
    table_sizes, starts = _meta(sizes, device)
    rows = (starts.cpu() + ids).reshape(-1)
    uniq, inverse = torch.unique(rows, return_inverse=True)
    g_rows = torch.zeros(len(uniq), dim, dtype=torch.float64).index_add_(0, inverse, grad.double().reshape(-1, dim))
    w64, s64 = _rowwise_adagrad64(w.double(), s.double(), 0.05, g_rows, uniq, 1e-8)
    w_dev, s_dev = w.to(device), s.to(device)
    seed = torch.tensor(7, device=device)
    embedding_bag_update_(w_dev, s_dev, torch.tensor(0.05, device=device), grad.to(device), ids.to(device),
                          table_sizes, starts, config=SMALL, seed=seed)
    torch.testing.assert_close(s_dev.cpu().double(), s64, rtol=1e-5, atol=1e-6)
    got = w_dev.cpu().double()
    assert torch.all((got - w64).abs() < _ulp(w64, dtype) * (1 + 1e-4)), (got - w64).abs().max()
    untouched = torch.ones(sum(sizes), dtype=torch.bool)
    untouched[uniq] = False
    assert torch.equal(got[untouched], w.double()[untouched])
    assert int(seed) == 8  # every update advances the seed by one


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_rounding_is_unbiased_where_nearest_would_lose_the_update(device, dtype):
    """Steps of 0.45 of a last place: rounding to nearest would leave every weight unchanged (an error of 0.45 last
    place); stochastic rounding moves the weights by the step on average (512 roundings over 16 seeds: within 0.1
    of a last place of the exact value, about 4.5 standard deviations), each to one of the two neighbours."""
    dim, rows = 16, 2
    w = torch.full((rows, dim), 1.0).to(dtype)  # last place 2^-7 (bf16) or 2^-10 (fp16) above 1, half that below
    below = _ulp(torch.tensor(0.99), dtype).item()
    step = 0.45 * below
    grad = torch.ones(1, rows, dim)
    ids = torch.zeros(1, rows, dtype=torch.int64)
    table_sizes, starts = _meta([1] * rows, device)
    results = []
    for k in range(16):
        w_dev = w.to(device, copy=True)
        embedding_bag_update_(w_dev, torch.empty(0, device=device), torch.tensor(step, device=device),
                              grad.to(device), ids.to(device), table_sizes, starts, optimizer=SGD(), config=SMALL,
                              seed=torch.tensor(1000 + k, device=device))
        results.append(w_dev.cpu().double())
    stack = torch.stack(results)
    assert set(torch.unique(stack).tolist()) <= {1.0, 1.0 - below}
    assert abs(stack.mean().item() - (1.0 - step)) < 0.1 * below


@pytest.mark.parametrize("dtype", HALF)
def test_half_module_is_reproducible_and_saves_its_seed(device, dtype):
    """Two seeded modules trained alike end bit-identical; the rounding seed is in the state dict and a module
    restored from it continues as the original does."""
    sizes, dim, batch = [5, 60, 9], 8, 16
    gen = torch.Generator().manual_seed(3)
    batches = [(_one_id_batch(sizes, batch, gen), torch.randn(batch, len(sizes), dim, generator=gen))
               for _ in range(3)]

    def make():
        return EmbeddingBagCollection(sizes, dim, lr=0.1, device=device, weight_dtype=dtype, config=SMALL,
                                      generator=torch.Generator().manual_seed(0))

    def train(m, items):
        for ids, up in items:
            m(ids.to(device)).backward(up.to(device))

    a, b = make(), make()
    assert a.weight.dtype == dtype and a.state.dtype == torch.float32
    train(a, batches)
    train(b, batches[:1])
    c = make()
    c.load_state_dict(b.state_dict())
    assert int(c.rounding_seed) == 1
    train(c, batches[1:])
    assert torch.equal(a.weight.cpu(), c.weight.cpu()) and torch.equal(a.state.cpu(), c.state.cpu())
    assert not torch.equal(a.weight.cpu(), make().weight.cpu())


def test_half_weight_arguments_are_checked(device):
    """A half weight needs a 0-dim int64 seed on its device and an fp32 optimizer state: else a clear error."""
    sizes = [4, 6]
    table_sizes, starts = _meta(sizes, device)
    w = torch.zeros(10, 4, dtype=torch.bfloat16, device=device)
    ids = torch.zeros(2, 2, dtype=torch.int64, device=device)
    grad = torch.zeros(2, 2, 4, device=device)
    lr = torch.tensor(0.1, device=device)
    with pytest.raises(ValueError, match="seed"):
        embedding_bag_update_(w, torch.zeros(10, device=device), lr, grad, ids, table_sizes, starts)
    with pytest.raises(ValueError, match="seed"):
        embedding_bag_update_(w, torch.zeros(10, device=device), lr, grad, ids, table_sizes, starts,
                              seed=torch.zeros(1, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match=r"state must be torch\.float32"):
        embedding_bag_update_(w, torch.zeros(10, dtype=torch.bfloat16, device=device), lr, grad, ids, table_sizes,
                              starts, seed=torch.zeros((), dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="weight_dtype"):
        EmbeddingBagCollection(sizes, 4, weight_dtype=torch.float64, device=device)
    assert math.isfinite(float(w.float().sum()))
