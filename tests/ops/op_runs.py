"""Every fused op run forward and backward on small inputs, for tests that compare launch paths or upstream
gradients across all ops. ``run(name, device, upstream)`` returns the outputs and the gradients (the embedding
collection: its updated weights), and ``reference(name, device, upstream)`` the same in float64 through the
references; ``upstream(shape)`` makes the gradient each output receives."""

from __future__ import annotations

from collections.abc import Callable

import torch
from toy_op import scale

import fuselab
from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, embedding_optimizer
from fuselab.nn import fused_linear
from fuselab.ops.embedding import EmbeddingBagCollection, EmbeddingConfig
from fuselab.reference import bias_act as ref_bias_act
from fuselab.reference import embedding as ref_embedding
from fuselab.reference import interaction as ref_interaction
from fuselab.reference import rope as ref_rope

OPS = ("rope", "bias_act", "bias_act_shift", "reduce", "reduce_mean_cols", "interaction", "interaction_self",
       "embedding", "embedding_bags", "fused_linear",
       "toy_scale")

_SMALL = EmbeddingConfig(lookup_elements=64, update_elements=64, rows_block=64, carry_elements=8, num_warps=1)
_SIZES = [1, 7, 30]

Upstream = Callable[[tuple[int, ...], torch.device], torch.Tensor]


def _inputs(name: str, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    if name == "rope":
        return [randn(2, 3, 2, 8), randn(2, 3, 1, 8)]
    if name == "bias_act":
        return [randn(5, 24), randn(24), randn(5, 24)]
    if name == "bias_act_shift":  # no residual: the backward rebuilds z from the saved x and the bias
        return [randn(5, 24), randn(24)]
    if name in ("reduce", "reduce_mean_cols"):
        return [randn(6, 9)]
    if name in ("interaction", "interaction_self"):
        return [randn(4, 8), randn(4, 3, 8)]
    if name == "embedding":
        return [torch.randint(0, 100, (4, len(_SIZES)), generator=g).to(device)]
    if name == "embedding_bags":  # 4 rows of 3 bags, one of them empty
        lengths = torch.tensor([2, 1, 3, 0, 4, 1, 1, 2, 5, 3, 1, 2])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        return [torch.randint(-100, 100, (int(offsets[-1]),), generator=g).to(device), offsets.to(device)]
    if name == "fused_linear":
        return [randn(5, 12), randn(10, 12), randn(10)]
    return [randn(5, 40), randn(40)]  # toy_scale


def _forward(name: str, leaves: list[torch.Tensor], f64: bool) -> tuple[torch.Tensor, ...]:
    """The op's differentiable outputs (fuselab's, or the reference's with ``f64``)."""
    if name == "rope":
        cos, sin = fuselab.rope_cos_sin(3, 8, device=leaves[0].device, dtype=leaves[0].dtype)
        return (ref_rope.apply_rope if f64 else fuselab.apply_rope)(leaves[0], leaves[1], cos, sin)
    if name == "bias_act":
        if f64:
            return (ref_bias_act.bias_act(leaves[0], leaves[1], leaves[2], 0.5, "gelu_tanh"),)
        return (fuselab.bias_act(leaves[0], leaves[1], residual=leaves[2], alpha=0.5, activation="gelu_tanh"),)
    if name == "bias_act_shift":
        if f64:
            return (ref_bias_act.bias_act(leaves[0], leaves[1], None, 1.0, "silu"),)
        return (fuselab.bias_act(leaves[0], leaves[1], activation="silu"),)
    if name == "reduce":  # the rows kernel
        return (leaves[0].sum(1) if f64 else fuselab.sum(leaves[0], 1),)
    if name == "reduce_mean_cols":  # the cols kernel
        return (leaves[0].mean(0) if f64 else fuselab.mean(leaves[0], 0),)
    if name == "interaction":
        if f64:
            return (ref_interaction.dot_interaction(leaves[0], leaves[1], False, 1),)
        return (fuselab.dot_interaction(leaves[0], leaves[1]),)
    if name == "interaction_self":  # the diagonal kept, padded to a multiple of 8 (the padding's gradient ignored)
        if f64:
            return (ref_interaction.dot_interaction(leaves[0], leaves[1], True, 8),)
        return (fuselab.dot_interaction(leaves[0], leaves[1], self_interaction=True, pad_to=8),)
    if name == "fused_linear":
        if f64:
            return (ref_bias_act.bias_act(leaves[0] @ leaves[1].t(), leaves[2], None, 1.0, "gelu_tanh"),)
        return (fused_linear(leaves[0], leaves[1], leaves[2], "gelu_tanh"),)
    return (leaves[0] * leaves[1] if f64 else scale(leaves[0], leaves[1]),)


def _embedding(name: str, device) -> EmbeddingBagCollection:
    """embedding: one id per feature, Adagrad; embedding_bags: mean-pooled bags, row-wise Adagrad."""
    if name == "embedding":
        return EmbeddingBagCollection(_SIZES, 8, optimizer=embedding_optimizer("adagrad"), lr=0.5, device=device,
                                      generator=torch.Generator().manual_seed(3), config=_SMALL)
    return EmbeddingBagCollection(_SIZES, 8, optimizer=ROWWISE_ADAGRAD, lr=0.5, pooling="mean", device=device,
                                  generator=torch.Generator().manual_seed(3), config=_SMALL)


def run(name: str, device, upstream: Upstream) -> list[torch.Tensor]:
    """Outputs and gradients of op ``name`` on ``device`` (the embedding collection: its updated tables), each
    output's gradient made by ``upstream``."""
    inputs = _inputs(name, device)
    if name.startswith("embedding"):
        module = _embedding(name, device)
        out = module(*inputs)
        out.backward(upstream(out.shape, device))
        return [out.detach(), module.weight.detach().clone(), module.state.detach().clone()]
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    outs = _forward(name, leaves, False)
    torch.autograd.backward(outs, [upstream(o.shape, device).to(o.dtype) for o in outs])
    return [*[o.detach() for o in outs], *[t.grad for t in leaves]]


def reference(name: str, device, upstream: Upstream) -> list[torch.Tensor]:
    """:func:`run` in float64 through the references (the embedding collection: the reference Adagrad step)."""
    inputs = _inputs(name, device)
    if name.startswith("embedding"):
        module = _embedding(name, device)
        weight, state = module.weight.double().clone(), module.state.double().clone()
        offsets = inputs[1] if len(inputs) > 1 else None
        out = ref_embedding.lookup(weight, inputs[0], module.table_sizes, module.row_offsets, offsets, module.pooling)
        grad = upstream(out.shape, device).double()
        ref_embedding.sparse_update_(weight, state, torch.tensor(0.5, dtype=torch.float64, device=device), grad,
                                     inputs[0], module.table_sizes, module.row_offsets, offsets, module.pooling,
                                     module.optimizer)
        return [out, weight, state]
    leaves = [t.double().requires_grad_(True) for t in inputs]
    outs = _forward(name, leaves, True)
    torch.autograd.backward(outs, [upstream(o.shape, device).double() for o in outs])
    return [*[o.detach() for o in outs], *[t.grad for t in leaves]]


# ---------------------------------------------------------------------------------------------- upstream gradients
def expanded(shape: tuple[int, ...], device) -> torch.Tensor:
    """What ``(out.sum() * 2).backward()`` hands the op: one value, every stride 0."""
    return torch.tensor(2.0, device=device).expand(shape)


def transposed(shape: tuple[int, ...], device) -> torch.Tensor:
    """Random values stored in the reverse axis order (no unit stride on the last axis)."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(*reversed(shape), generator=g).to(device).permute(*reversed(range(len(shape))))


def sliced(shape: tuple[int, ...], device) -> torch.Tensor:
    """Random values in a wider buffer: rows padded, the last axis unit-stride."""
    g = torch.Generator().manual_seed(12)
    return torch.randn(*shape[:-1], shape[-1] + 3, generator=g).to(device)[..., : shape[-1]]


def broadcast_rows(shape: tuple[int, ...], device) -> torch.Tensor:
    """One random row repeated over the leading axes (stride 0 there, unit stride on the last)."""
    g = torch.Generator().manual_seed(13)
    return torch.randn(shape[-1], generator=g).to(device).expand(shape)


def contiguous(shape: tuple[int, ...], device) -> torch.Tensor:
    g = torch.Generator().manual_seed(14)
    return torch.randn(*shape, generator=g).to(device)


UPSTREAMS: dict[str, Upstream] = {"contiguous": contiguous, "expanded": expanded, "transposed": transposed,
                                  "sliced": sliced, "broadcast_rows": broadcast_rows}
