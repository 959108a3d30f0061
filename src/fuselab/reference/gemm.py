"""Pure-PyTorch GEMM family: the CPU path of :mod:`fuselab.ops.gemm` and the tests' oracle (``docs/gemm.md``).

* :func:`linear`: ``act(x Wᵀ + b + alpha·r + s·(x Aᵀ) Bᵀ)`` cast to ``out_dtype``;
* :func:`dcn_cross`: the DCNv2 cross layer ``x0 ⊙ (xl Wᵀ + b) + xl``, low rank ``x0 ⊙ ((xl Vᵀ) Wᵀ + b) + xl``;
* :func:`qkv_rope`: the fused QKV projection, then :func:`fuselab.reference.rope.apply_rope` on q and k;
* :func:`pack_bits` / :func:`unpack_bits`: the 1-bit ReLU masks the fused forward keeps for its backward;
* :func:`cast_update`: an optimizer step on fp32 master weights that also writes their low-precision copy.

Low-precision inputs compute in float32 (float64 stays float64, how the tests build the oracle) and results are cast
to the output dtype. Everything is differentiable by autograd.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .bias_act import activation as apply_activation
from .bias_act import compute_dtype
from .rope import apply_rope

#: the optimizers :func:`cast_update` knows
CAST_UPDATE_OPTIMIZERS: tuple[str, ...] = ("sgd", "adagrad")


@dataclass(frozen=True)
class LoRA:
    """A LoRA branch ``scale·(x Aᵀ) Bᵀ``: ``a`` ``[rank, in]``, ``b`` ``[out, rank]``, ``scale`` (alpha / rank)."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float = 1.0


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, alpha: float = 1.0, activation: str = "none",
           lora: LoRA | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``act(x Wᵀ + b + alpha·r + s·(x Aᵀ) Bᵀ)`` in the compute dtype, cast to ``out_dtype`` (default x's)."""
    acc = compute_dtype(x.dtype)
    xa = x.to(acc)
    z = xa @ weight.to(acc).t()
    if bias is not None:
        z = z + bias.to(acc)
    if residual is not None:
        z = z + alpha * residual.to(acc)
    if lora is not None:
        z = z + lora.scale * ((xa @ lora.a.to(acc).t()) @ lora.b.to(acc).t())
    return apply_activation(z, activation).to(out_dtype or x.dtype)


def dcn_cross(x0: torch.Tensor, xl: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              weight_v: torch.Tensor | None = None) -> torch.Tensor:
    """``x0 ⊙ (xl Wᵀ + b) + xl`` (``weight`` [N, N]); with ``weight_v`` [r, N] the low-rank
    ``x0 ⊙ ((xl Vᵀ) Wᵀ + b) + xl`` (``weight`` [N, r]), the intermediate ``xl Vᵀ`` rounded to xl's dtype as the
    fused op keeps it."""
    acc = compute_dtype(xl.dtype)
    h = xl
    if weight_v is not None:
        h = (xl.to(acc) @ weight_v.to(acc).t()).to(xl.dtype)
    z = h.to(acc) @ weight.to(acc).t()
    if bias is not None:
        z = z + bias.to(acc)
    return (x0.to(acc) * z + xl.to(acc)).to(xl.dtype)


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, num_heads: int, num_kv_heads: int,
             rope: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of the projection ``x Wᵀ + b`` (``weight`` ``[(num_heads + 2 num_kv_heads) · head_dim, hidden]``),
    q and k rotated by :func:`fuselab.reference.rope.apply_rope` with the keyword arguments ``rope`` (cos, sin,
    layout, interleaved, positions, ...). ``x`` is ``[B, S, hidden]`` (``layout`` bshd or bhsd), ``[S, B, hidden]``
    (sbhd) or ``[T, hidden]`` (thd); q/k/v come out in ``layout``."""
    layout = rope.get("layout", "bshd")
    head_dim = weight.shape[0] // (num_heads + 2 * num_kv_heads)
    qkv = linear(x, weight, bias)
    heads = qkv.view(*qkv.shape[:-1], num_heads + 2 * num_kv_heads, head_dim)
    q, k, v = heads.split((num_heads, num_kv_heads, num_kv_heads), dim=-2)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    options = {key: value for key, value in rope.items() if key not in ("cos", "sin")}
    q, k = apply_rope(q, k, rope.get("cos"), rope.get("sin"), **options)
    return q, k, v


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """``[M, N]`` bool -> ``[M, ceil(N / 8)]`` uint8, bit j of word w holding column 8w + j."""
    m, n = mask.shape
    padded = torch.zeros(m, -(-n // 8) * 8, dtype=torch.int32, device=mask.device)
    padded[:, :n] = mask.to(torch.int32)
    weights = (1 << torch.arange(8, device=mask.device, dtype=torch.int32))
    return (padded.view(m, -1, 8) * weights).sum(-1).to(torch.uint8)


def unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``[M, ceil(n / 8)]`` uint8 -> ``[M, n]`` bool."""
    shifts = torch.arange(8, device=bits.device, dtype=torch.int32)
    return ((bits.to(torch.int32)[:, :, None] >> shifts) & 1).flatten(1)[:, :n].bool()


def cast_update(master: torch.Tensor, grad: torch.Tensor, state: torch.Tensor | None, *, optimizer: str, lr: float,
                weight_decay: float = 0.0, eps: float = 1e-10,
                low_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One step on fp32 ``master`` weights: (new master, new state, the new master cast to ``low_dtype``).

    ``g = grad + weight_decay·master``; ``sgd``: ``master - lr·g``; ``adagrad``: ``state + g²`` then
    ``master - lr·g / (sqrt(state) + eps)`` (``state`` the sum of squares, torch.optim.Adagrad's)."""
    acc = torch.float64 if master.dtype == torch.float64 else torch.float32
    w = master.to(acc)
    g = grad.to(acc) + weight_decay * w
    new_state = None
    if optimizer == "sgd":
        w = w - lr * g
    elif optimizer == "adagrad":
        new_state = state.to(acc) + g * g
        w = w - lr * g / (new_state.sqrt() + eps)
    else:
        raise ValueError(f"optimizer must be one of {', '.join(CAST_UPDATE_OPTIMIZERS)}, got {optimizer!r}")
    return (w.to(master.dtype), None if new_state is None else new_state.to(state.dtype), w.to(low_dtype))
