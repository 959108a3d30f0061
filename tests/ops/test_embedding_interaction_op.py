"""The embedding collection's and the dot interaction's :class:`~fuselab.ops.opdef.Op`: an eager call whose signature
a checked call planned skips the checks and the plan (both patched to fail here) and repeats the cached plan, the
backward's (the fused optimizer update, the interaction's gradients) included, bit for bit equal to planned calls and
to float64 oracles written here; signatures that must miss (other id counts, ``True`` for 1); two lookups before one
backward; ``opcheck`` (every test) and ``torch.compile(fullgraph=True)`` of every custom op of both packages.

Values of planned calls are checked in detail by test_embedding.py and test_interaction.py.
"""

from __future__ import annotations

import pytest
import torch

import fuselab.ops.embedding.checks as emb_checks
import fuselab.ops.embedding.launch as emb_launch
import fuselab.ops.embedding.op as emb_op
import fuselab.ops.interaction.checks as int_checks
import fuselab.ops.interaction.launch as int_launch
import fuselab.ops.interaction.op as int_op
from fuselab.backend import forced
from fuselab.core.embedding_optimizer import Adagrad, RowwiseAdagrad, embedding_optimizer
from fuselab.ops import opdef
from fuselab.ops.embedding import EmbeddingBagCollection, EmbeddingConfig, embedding_bag_lookup, embedding_bag_update_
from fuselab.ops.interaction import dot_interaction
from fuselab.testing import assert_close

SMALL = EmbeddingConfig(lookup_elements=64, update_elements=64, rows_block=64, carry_elements=8, num_warps=1)
SIZES = [1, 7, 300]  # table 0: every id is row 0 (long runs of duplicates)


#: the ``triton_backend`` fixture without its default-device context: every test here places its tensors itself
#: (oracle data on the CPU, ``.to(device)`` for the kernels)
PLACES_ITS_TENSORS = True


@pytest.fixture(autouse=True)
def _fresh():
    opdef.clear()
    yield
    opdef.clear()


@pytest.fixture
def no_planning(monkeypatch):
    """A function that makes every check and plan of both ops fail from then on."""
    def arm() -> None:
        def fail(*args, **kwargs):
            raise AssertionError("a call of a kept key checked or planned again")

        for module, name in ((emb_checks, "validate_lookup"), (emb_checks, "validate_update"), (emb_launch, "blocks"),
                             (int_checks, "validate"), (int_checks, "validate_gradient"), (int_launch, "blocks")):
            monkeypatch.setattr(module, name, fail)
    return arm


# ---------------------------------------------------------------------------------------------- oracles
def _global_rows(ids: torch.Tensor, sizes: list[int]) -> list[list[int]]:
    """Row of each (b, f): first row of table f + id mod its size (Python's non-negative modulus)."""
    starts = [sum(sizes[:f]) for f in range(len(sizes))]
    return [[starts[f] + raw % sizes[f] for f, raw in enumerate(row)] for row in ids.tolist()]


def _oracle_step(w64, s64, lr: float, ids, grad, sizes, optimizer: str, eps: float = 1e-8) -> None:
    """torch.optim's step on the coalesced row gradients of a lookup of ``ids``, in float64, in place."""
    rows = _global_rows(ids, sizes)
    total: dict[int, torch.Tensor] = {}
    g64 = grad.double().cpu()
    for b, row in enumerate(rows):
        for f, r in enumerate(row):
            total[r] = total.get(r, 0.0) + g64[b, f]
    for r, g in total.items():
        if optimizer == "sgd":
            w64[r] -= lr * g
            continue
        s64[r] += g * g if optimizer == "adagrad" else (g * g).mean()
        w64[r] -= lr * g / (s64[r].sqrt() + eps)


def _gram_oracle(dense, emb, self_interaction: bool, pad_to: int) -> torch.Tensor:
    """float64 [dense, v_i . v_j for j < i (j <= i with self_interaction), zeros to a multiple of pad_to]."""
    vectors = [dense.double()] + [emb[:, k].double() for k in range(emb.shape[1])]
    cols = [dense.double()] + [(vectors[i] * vectors[j]).sum(-1, keepdim=True) for i in range(len(vectors))
                               for j in range(i + 1 if self_interaction else i)]
    out = torch.cat(cols, dim=1)
    width = -(-out.shape[1] // pad_to) * pad_to
    return torch.cat([out, out.new_zeros(out.shape[0], width - out.shape[1])], dim=1)


# ---------------------------------------------------------------------------------------------- kept launches
def _module(optimizer: str, device) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(SIZES, 5, optimizer=embedding_optimizer(optimizer), lr=0.1, device=device,
                                  generator=torch.Generator().manual_seed(3), config=SMALL)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_embedding_steps_repeat_kept_launches(triton_backend, device, no_planning, optimizer):
    """Three training steps of one shape: the first checks, plans and keeps the lookup and the update; the next two
    repeat them (checks and plans would raise). Equal bit for bit to steps that each plan anew, and to the oracle."""
    gen = torch.Generator().manual_seed(4)
    batches = [(torch.randint(-10**6, 10**6, (20, len(SIZES)), generator=gen), torch.randn(20, len(SIZES), 5,
                                                                                            generator=gen))
               for _ in range(3)]
    planned = _module(optimizer, device)
    for ids, up in batches:
        opdef.clear()
        (planned(ids.to(device)) * up.to(device)).sum().backward()
    opdef.clear()
    m = _module(optimizer, device)
    w64, s64 = m.weight.double().cpu(), m.state.double().cpu()
    for step, (ids, up) in enumerate(batches):
        if step == 1:
            assert len(emb_op.TRAIN.plans) == 1 and len(emb_op.UPDATE.plans) == 1
            no_planning()
        rows = m.weight.cpu()[torch.tensor(_global_rows(ids, SIZES))]
        out = m(ids.to(device))
        assert torch.equal(out.cpu(), rows), f"lookup of step {step}"  # a lookup copies rows
        _oracle_step(w64, s64, 0.1, ids, up, SIZES, optimizer)
        (out * up.to(device)).sum().backward()
        torch.testing.assert_close(m.weight.double().cpu(), w64, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(m.state.double().cpu(), s64, atol=2e-6, rtol=1e-5)
    assert torch.equal(m.weight, planned.weight) and torch.equal(m.state, planned.state)


@pytest.mark.parametrize("bags", [False, True], ids=["one_id", "bags"])
def test_embedding_functional_calls_repeat_kept_launches(triton_backend, device, no_planning, bags):
    """embedding_bag_lookup and embedding_bag_update_ called again with the same layouts repeat their kept launches
    (the same bits as the planned calls); another id count is another key: it is checked and planned."""
    gen = torch.Generator().manual_seed(5)
    sizes_t = torch.tensor(SIZES, device=device)
    starts = torch.tensor([0, 1, 8], device=device)
    w0 = torch.randn(sum(SIZES), 5, generator=gen).to(device)
    if bags:
        offsets = torch.tensor([0, 2, 2, 5, 6, 9, 9], device=device)  # B = 2, F = 3, one empty bag
        ids = torch.randint(-999, 999, (9,), generator=gen).to(device)
    else:
        offsets, ids = None, torch.randint(-999, 999, (4, 3), generator=gen).to(device)
    grad = torch.randn(2 if bags else 4, 3, 5, generator=gen).to(device)
    lr = torch.tensor(0.2, device=device)
    results = []
    for call in range(2):
        if call == 1:
            no_planning()
        w, s = w0.clone(), torch.zeros(sum(SIZES), device=device)
        out = embedding_bag_lookup(w, ids, sizes_t, starts, offsets, pooling="mean", config=SMALL)
        embedding_bag_update_(w, s, lr, grad, ids, sizes_t, starts, offsets, pooling="mean", config=SMALL)
        results.append((out, w, s))
    assert not torch.equal(results[0][1], w0)  # the update did run
    for a, b in zip(*results):
        assert torch.equal(a, b)
    with pytest.raises(AssertionError, match="checked or planned"):  # one id position more: a new key
        embedding_bag_lookup(w0, torch.cat([ids, ids[:1]]) if bags else ids[:3], sizes_t, starts,
                             None if offsets is None else torch.cat([offsets[:-1], offsets[-1:] + 1]),
                             pooling="mean", config=SMALL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_interaction_repeats_kept_launches(triton_backend, device, no_planning, dtype):
    """dot_interaction forward and backward of one layout: after the first call neither checks nor plans; the
    same bits as planned calls, and the forward within one rounding of the float64 oracle."""
    gen = torch.Generator().manual_seed(6)
    cases = [(torch.randn(6, 9, generator=gen).to(dtype), torch.randn(6, 5, 9, generator=gen).to(dtype),
              torch.randn(6, 32, generator=gen).to(dtype)) for _ in range(3)]  # 9 + 21 pairs, padded to 32

    def run(dense, emb, grad):
        d, e = (t.to(device).detach().clone().requires_grad_(True) for t in (dense, emb))
        out = dot_interaction(d, e, self_interaction=True, pad_to=8)
        out.backward(grad.to(device))
        return out.detach(), d.grad, e.grad

    planned = []
    for case in cases:
        opdef.clear()
        planned.append(run(*case))
    opdef.clear()
    for i, case in enumerate(cases):
        if i == 1:
            assert len(int_op.FORWARD.plans) == 1 and len(int_op.BACKWARD.plans) == 1
            no_planning()
        got = run(*case)
        for a, b in zip(got, planned[i]):
            assert torch.equal(a, b)
        ref = _gram_oracle(case[0], case[1], True, 8)
        err = (got[0].double().cpu() - ref).abs()
        assert (err <= 2.0 ** -8 * ref.abs() + 1e-5 * (1 + ref.abs())).all(), "forward off the oracle"
    with torch.no_grad():  # the no-grad forward repeats the same kept launch
        out = dot_interaction(cases[0][0].to(device), cases[0][1].to(device), self_interaction=True, pad_to=8)
    assert torch.equal(out, planned[0][0])


def test_keys_tell_true_from_one(triton_backend, device):
    """A kept call with pad_to=1 does not let pad_to=True skip the checks that reject it; the optimizer's eps is
    checked where the optimizer is made (eps=True never reaches a key)."""
    dense, emb = torch.randn(3, 4, device=device), torch.randn(3, 2, 4, device=device)
    dot_interaction(dense, emb, pad_to=1)
    assert len(int_op.FORWARD.plans) == 1
    with pytest.raises(TypeError, match="pad_to must be an int"):
        dot_interaction(dense, emb, pad_to=True)
    w, s = torch.randn(8, 4, device=device), torch.zeros(8, device=device)
    sizes, starts = torch.tensor([3, 5], device=device), torch.tensor([0, 3], device=device)
    ids, grad, lr = torch.randint(0, 9, (3, 2), device=device), torch.randn(3, 2, 4, device=device), torch.tensor(
        0.1, device=device)
    embedding_bag_update_(w, s, lr, grad, ids, sizes, starts, optimizer=RowwiseAdagrad(eps=1))
    assert len(emb_op.UPDATE.plans) == 1
    with pytest.raises(TypeError, match="eps"):
        RowwiseAdagrad(eps=True)


def test_backward_launches_are_keyed_by_the_gradient_layout(triton_backend, device):
    """One forward key, then output gradients of other strides (transposed, permuted): each backward reads its
    gradient through its own strides (a launch kept for a contiguous gradient is not repeated on another layout)."""
    gen = torch.Generator().manual_seed(9)
    dense, emb = torch.randn(5, 7, generator=gen), torch.randn(5, 3, 7, generator=gen)  # W = 7 + 6 pairs
    for grad in (torch.randn(5, 13, generator=gen), torch.randn(13, 5, generator=gen).t(),
                 torch.randn(5, 13, generator=gen)):
        d, e = (t.to(device).detach().clone().requires_grad_(True) for t in (dense, emb))
        dot_interaction(d, e).backward(grad.to(device))
        d64, e64 = (t.detach().double().requires_grad_(True) for t in (dense, emb))
        _gram_oracle(d64, e64, False, 1).backward(grad.double())
        torch.testing.assert_close(d.grad.double().cpu(), d64.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(e.grad.double().cpu(), e64.grad, atol=1e-5, rtol=1e-5)
    m = _module("sgd", device)
    w64, s64 = m.weight.double().cpu(), None
    ids = torch.randint(0, 10**6, (6, len(SIZES)), generator=gen)
    for up in (torch.randn(6, 3, 5, generator=gen), torch.randn(5, 3, 6, generator=gen).permute(2, 1, 0),
               torch.randn(6, 3, 5, generator=gen)):
        m(ids.to(device)).backward(up.to(device))
        _oracle_step(w64, s64, 0.1, ids, up, SIZES, "sgd")
        torch.testing.assert_close(m.weight.double().cpu(), w64, atol=2e-6, rtol=1e-5)
    assert len(emb_op.UPDATE.plans) == 2 and len(int_op.BACKWARD.plans) == 2  # one per gradient layout


# ---------------------------------------------------------------------------------------------- autograd
def test_two_lookups_before_one_backward(backend, device):
    """Two lookups of one module, one backward: both updates apply (the last lookup's first), with no version
    error although the first update changes the weight the second node reads."""
    gen = torch.Generator().manual_seed(7)
    m = _module("adagrad", device)
    w64, s64 = m.weight.double().cpu(), m.state.double().cpu()
    ids = [torch.randint(0, 10**6, (6, len(SIZES)), generator=gen) for _ in range(2)]
    ups = [torch.randn(6, len(SIZES), 5, generator=gen) for _ in range(2)]
    before = m.weight.detach().cpu().clone()
    outs = [m(i.to(device)) for i in ids]
    sum((o * u.to(device)).sum() for o, u in zip(outs, ups)).backward()
    for k in (1, 0):  # autograd runs the later node first
        _oracle_step(w64, s64, 0.1, ids[k], ups[k], SIZES, "adagrad")
    for k in range(2):
        assert torch.equal(outs[k].detach().cpu(), before[torch.tensor(_global_rows(ids[k], SIZES))])
    torch.testing.assert_close(m.weight.double().cpu(), w64, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(m.state.double().cpu(), s64, atol=2e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- torch.library
def test_ops_of_both_packages():
    """Every custom op of the two packages is an Op, under its public name."""
    names = {op.name for op in (emb_op.LOOKUP, emb_op.UPDATE, emb_op.TRAIN, int_op.FORWARD, int_op.BACKWARD)}
    assert names == {"fuselab::embedding_bag_lookup", "fuselab::embedding_bag_update_", "fuselab::embedding_bag_train",
                     "fuselab::dot_interaction", "fuselab::dot_interaction_bwd"}
    assert emb_op.UPDATE.mutates == ("weight", "state", "seed") and not emb_op.TRAIN.mutates
    assert torch.ops.fuselab.embedding_bag_update_.default._schema.is_mutable


def test_opcheck_interaction_backward_all_tests(device):
    """Every opcheck test of fuselab::dot_interaction_bwd (test_interaction.py runs them on the forward)."""
    dense, emb = torch.randn(3, 5, device=device), torch.randn(3, 2, 5, device=device)
    with forced("triton"):
        torch.library.opcheck(int_op.BACKWARD.custom, (torch.randn(3, 16, device=device), dense, emb, True))
        torch.library.opcheck(int_op.BACKWARD.custom, (torch.randn(3, 8, device=device), dense, emb, False))


def test_compile_fullgraph_lookup_and_update(backend, device):
    """embedding_bag_lookup and embedding_bag_update_ (the mutating op) in one compiled graph, equal to eager."""
    gen = torch.Generator().manual_seed(8)
    w0 = torch.randn(sum(SIZES), 5, generator=gen).to(device)
    ids = torch.randint(-500, 500, (7, 3), generator=gen).to(device)
    sizes, starts = torch.tensor(SIZES, device=device), torch.tensor([0, 1, 8], device=device)
    up, lr = torch.randn(7, 3, 5, generator=gen).to(device), torch.tensor(0.3, device=device)

    def step(w, s):
        out = embedding_bag_lookup(w, ids, sizes, starts, config=SMALL)
        embedding_bag_update_(w, s, lr, out * up, ids, sizes, starts, optimizer=Adagrad(), config=SMALL)
        return out

    torch._dynamo.reset()
    results = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="inductor" if device.type == "cuda" else "aot_eager")):
        w, s = w0.clone(), torch.zeros_like(w0)
        with torch.no_grad():
            results.append((fn(w, s), w, s))
    assert not torch.equal(results[0][1], w0)
    # the Triton path runs the same kernels compiled or not: the same bits. The PyTorch path compiled by Inductor
    # on CUDA is other kernels (fused, contracted to FMAs, scatter-adds in another order): one fp32 rounding apart
    exact = backend == "triton" or device.type != "cuda"
    for a, b in zip(*results):
        if exact:
            torch.testing.assert_close(b, a, atol=0, rtol=0)
        else:
            assert_close(b, a, torch.float32, "compiled PyTorch-path step", chained=True)
