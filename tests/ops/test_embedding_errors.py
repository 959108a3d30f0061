"""Every bad input to the embedding collection's functions raises TypeError/ValueError naming the argument, on both
backends, on a first call and after good calls planned their signatures (a repeat takes the cached path). The tensors
an update writes in place (weight, its optimizer state, the rounding seed) may not share elements nor overlap another
argument: a bad call whose signature equals a planned good call's (only the memory the tensors share differs) is
refused on the cached path too, and writes nothing."""

from __future__ import annotations

import pytest
import torch

import fuselab.ops
from fuselab.core.embedding_optimizer import Adagrad, RowwiseAdagrad
from fuselab.ops.embedding import EmbeddingConfig, embedding_bag_collection, embedding_bag_lookup, embedding_bag_update_

SMALL = EmbeddingConfig(lookup_elements=64, update_elements=64, rows_block=64, carry_elements=8, num_warps=1)
ADAGRAD = Adagrad()

#: tensors are made on the CPU and moved to the test device by the tests (the meta-device case needs a CPU weight)
PLACES_ITS_TENSORS = True


@pytest.fixture
def backend(backend):
    """The shared ``backend`` fixture, with the op caches emptied before and after the test."""
    fuselab.ops.clear()
    yield backend
    fuselab.ops.clear()


def _valid(device):
    w = torch.randn(10, 4, device=device)
    sizes = torch.tensor([4, 6], dtype=torch.int64, device=device)
    starts = torch.tensor([0, 4], dtype=torch.int64, device=device)
    return w, torch.zeros(3, 2, dtype=torch.int64, device=device), sizes, starts


def _good_calls(device) -> None:
    """Plan the signatures next to the bad cases' (one id per feature and bags, lookup and update), twice each."""
    w, ids, sizes, starts = _valid(device)
    state, lr, grad = torch.zeros(10, device=device), torch.tensor(0.1, device=device), torch.zeros(3, 2, 4,
                                                                                                    device=device)
    flat, offsets = torch.zeros(5, dtype=torch.int64, device=device), torch.tensor([0, 1, 2, 3, 4, 5, 5],
                                                                                   device=device)
    for _ in range(2):
        embedding_bag_lookup(w, ids, sizes, starts)
        embedding_bag_lookup(w, flat, sizes, starts, offsets)
        embedding_bag_update_(w, state, lr, grad, ids, sizes, starts)


LOOKUP_CASES = [
    ("ids_float", TypeError, "ids"),
    ("ids_rank", ValueError, "ids"),
    ("ids_f_mismatch", ValueError, "ids"),
    ("weight_int", TypeError, "weight"),
    ("weight_rank", ValueError, "weight"),
    ("sizes_dtype", TypeError, "table_sizes"),
    ("offsets_len", ValueError, "row_offsets"),
    ("bag_offsets_shape", ValueError, "offsets"),
    ("bag_offsets_dtype", TypeError, "offsets"),
    ("bag_ids_rank", ValueError, "ids"),
    ("pooling", ValueError, "pooling"),
    ("not_tensor", TypeError, "ids"),
    ("meta_device", ValueError, "device"),
]


@pytest.mark.parametrize("when", ["first", "cached"])
@pytest.mark.parametrize("case, exc, match", LOOKUP_CASES)
def test_lookup_errors(backend, device, when, case, exc, match):
    if when == "cached":
        _good_calls(device)
    w, ids, sizes, starts = _valid(device)
    offsets = None
    kw = {}
    if case == "ids_float":
        ids = ids.float()
    elif case == "ids_rank":
        ids = ids[:, :, None]
    elif case == "ids_f_mismatch":
        ids = torch.zeros(3, 3, dtype=torch.int64, device=device)
    elif case == "weight_int":
        w = w.long()
    elif case == "weight_rank":
        w = w.view(-1)
    elif case == "sizes_dtype":
        sizes = sizes.int()
    elif case == "offsets_len":
        starts = starts[:1]
    elif case == "bag_offsets_shape":
        ids, offsets = torch.zeros(5, dtype=torch.int64, device=device), torch.zeros(6, dtype=torch.int64,
                                                                                     device=device)
    elif case == "bag_offsets_dtype":
        ids, offsets = torch.zeros(5, dtype=torch.int64, device=device), torch.zeros(7, dtype=torch.int32,
                                                                                     device=device)
    elif case == "bag_ids_rank":
        offsets = torch.zeros(7, dtype=torch.int64, device=device)
    elif case == "pooling":
        kw["pooling"] = "max"
    elif case == "not_tensor":
        ids = [[0, 1]]
    elif case == "meta_device":
        ids = ids.to("meta")
    with pytest.raises(exc, match=match):
        embedding_bag_lookup(w, ids, sizes, starts, offsets, **kw)


@pytest.mark.parametrize("when", ["first", "cached"])
@pytest.mark.parametrize("case, exc, match", [
    ("optimizer", TypeError, "optimizer"),
    ("state_shape", ValueError, "state"),
    ("lr_shape", ValueError, "lr"),
    ("grad_shape", ValueError, "grad"),
    ("grad_int", TypeError, "grad"),
    ("eps", ValueError, "eps"),
    ("eps_true", TypeError, "eps"),  # True is no eps, though it hashes as 1
    ("weight_expanded", ValueError, "weight"),  # written in place: its elements must be distinct
])
def test_update_errors(backend, device, when, case, exc, match):
    if when == "cached":
        _good_calls(device)
        w, ids, sizes, starts = _valid(device)
        embedding_bag_update_(w, torch.zeros(10, device=device), torch.tensor(0.1, device=device),
                              torch.zeros(3, 2, 4, device=device), ids, sizes, starts, optimizer=RowwiseAdagrad(eps=1))
    w, ids, sizes, starts = _valid(device)
    state, lr, grad = torch.zeros(10, device=device), torch.tensor(0.1, device=device), torch.zeros(3, 2, 4,
                                                                                                    device=device)
    kw = {}
    if case == "optimizer":
        kw["optimizer"] = "adam"
    elif case == "state_shape":
        state = torch.zeros(10, 4, device=device)
    elif case == "lr_shape":
        lr = torch.tensor([0.1], device=device)
    elif case == "grad_shape":
        grad = torch.zeros(3, 2, 5, device=device)
    elif case == "grad_int":
        grad = grad.long()
    elif case == "weight_expanded":
        w = torch.randn(1, 4, device=device).expand(10, 4)
    with pytest.raises(exc, match=match):
        if case in ("eps", "eps_true"):  # checked where the optimizer is made
            kw["optimizer"] = RowwiseAdagrad(eps=-1.0 if case == "eps" else True)
        embedding_bag_update_(w, state, lr, grad, ids, sizes, starts, **kw)


# ---------------------------------------------------------------------------------------------- overlapping writes
def _update_case(name: str, device):
    """(arguments of a good update call, of a bad one of the same signature, the error's pattern). adagrad: the
    state (R, D) is laid out as the weight."""
    w, ids, sizes, starts = _valid(device)
    state = torch.zeros(10, 4, device=device)
    lr, grad = torch.tensor(0.1, device=device), torch.randn(3, 2, 4, device=device)
    good = [w, state, lr, grad, ids, sizes, starts]
    if name == "state_is_weight":
        return good, [w, w, lr, grad, ids, sizes, starts], "weight and state overlap"
    if name == "grad_views_weight":  # rows 0-5 of the weight, laid out as a fresh (3, 2, 4) gradient
        return good, [w, state, lr, w[:6].view(3, 2, 4), ids, sizes, starts], "weight and grad overlap"
    if name == "lr_views_state":  # a 0-dim view of the state's first element, laid out as a fresh lr
        return good, [w, state, state[0, 0], grad, ids, sizes, starts], "state and lr overlap"
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["state_is_weight", "grad_views_weight", "lr_views_state"])
def test_update_refuses_overlapping_writes(backend, device, name):
    """The same error on a first call and on the cached path (the good call's signature is the bad one's), and the
    bad call writes nothing."""
    good, bad, match = _update_case(name, device)
    before = [t.clone() for t in bad[:2]]
    with pytest.raises(ValueError, match=match):
        embedding_bag_update_(*bad, optimizer=ADAGRAD, config=SMALL)
    for _ in range(2):
        embedding_bag_update_(*[t.clone() for t in good], optimizer=ADAGRAD, config=SMALL)
    with pytest.raises(ValueError, match=match):
        embedding_bag_update_(*bad, optimizer=ADAGRAD, config=SMALL)
    for t, was in zip(bad[:2], before):
        assert torch.equal(t, was)


def _train(w, state, ids, sizes, starts, device) -> torch.Tensor:
    anchor = torch.empty(0, device=device, requires_grad=True)
    return embedding_bag_collection(w, state, torch.tensor(0.1, device=device), ids, sizes, starts, anchor=anchor,
                                    optimizer=ADAGRAD, config=SMALL)


def test_training_lookup_refuses_overlapping_writes(backend, device):
    """The training lookup (its backward is the update) refuses a state that is the weight, and its backward a
    gradient that overlaps the weight: on a first call (nothing planned) and after good calls planned both
    signatures (the bad gradient is laid out as the good ones). Nothing is written."""
    w, ids, sizes, starts = _valid(device)
    before = w.clone()

    def bad_calls() -> None:
        with pytest.raises(ValueError, match="weight and state overlap"):
            _train(w, w, ids, sizes, starts, device)
        out = _train(w, torch.zeros(10, 4, device=device), ids, sizes, starts, device)
        with pytest.raises(ValueError, match="weight and grad overlap"):
            out.backward(w[:6].view(3, 2, 4))
        assert torch.equal(w, before)

    bad_calls()
    for _ in range(2):
        _train(w.clone(), torch.zeros(10, 4, device=device), ids, sizes, starts, device).backward(
            torch.randn(3, 2, 4, device=device))
    bad_calls()
