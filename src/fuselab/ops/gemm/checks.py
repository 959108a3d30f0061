"""Argument checks of the GEMM family: ``validate(...) -> GemmCall``, ``validate_dcn(...) -> DcnCall``,
``validate_qkv(...) -> QkvCall``: frozen records of the validated arguments plus what is derived from them (a
``signature``, the launch cache's key, where the op keeps launches; ``inputs`` / ``from_inputs``, the custom op's
inputs and back). ``docs/gemm.md`` lists the errors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fuselab.core.activations import ACTIVATIONS, SAVED
from fuselab.core.checks import require_float, require_same_device, require_tensor
from fuselab.ops._recordop import operand
from fuselab.ops.bias_act.checks import check_activation
from fuselab.reference.gemm import LoRA

#: what the forward keeps for the backward: "auto" picks per activation (the output for relu/relu2/sigmoid, the
#: pre-activation for silu/gelu/gelu_tanh); "mask" (relu only) a 1-bit-per-element mask
KEEP_CHOICES: tuple[str, ...] = ("auto", "output", "pre", "mask")
#: the largest LoRA rank the fused kernel takes (its side accumulator lives in registers)
MAX_LORA_RANK = 128


@dataclass(frozen=True)
class LinearOptions:
    """The non-tensor arguments of :func:`fuselab.gemm`."""

    alpha: float = 1.0
    activation: str = "none"
    keep: str = "auto"
    out_dtype: torch.dtype | None = None


def resolve_keep(activation: str, keep: str, needs_grad: bool) -> str:
    """What the forward writes for the backward: "nothing", "output", "pre" or "mask"."""
    if not needs_grad or activation == "none":
        return "nothing"
    if keep == "auto":
        return SAVED[activation]
    return keep


def tf32_enabled() -> bool:
    """Whether fp32 GEMMs may round their operands to TF32: torch's own switch
    (``torch.set_float32_matmul_precision``: anything but "highest")."""
    return torch.get_float32_matmul_precision() != "highest"


def signature_of(x, weight, bias, residual, lora, options: LinearOptions, needs_grad: bool) -> tuple:
    """The launch key of a :func:`fuselab.gemm` call: every operand's shape, strides, dtype, device, storage offset
    and 16-byte alignment, the options, whether autograd records it and the TF32 switch. Raises AttributeError /
    TypeError for non-tensors or unhashable options (the checks then name the argument)."""
    lora_key = None if lora is None else (operand(lora.a), operand(lora.b), type(lora.scale))
    return (operand(x), operand(weight), None if bias is None else operand(bias),
            None if residual is None else operand(residual), lora_key, type(options.alpha), options.activation,
            options.keep, options.out_dtype, needs_grad, tf32_enabled())


@dataclass(frozen=True)
class GemmCall:
    """A validated :func:`fuselab.gemm` call: the arguments, the resolved ``keep`` and ``out_dtype`` and the sizes
    (``M`` rows: the product of x's leading dims)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    lora: LoRA | None
    alpha: float
    activation: str
    keep: str
    out_dtype: torch.dtype
    needs_grad: bool
    M: int
    N: int
    K: int

    @property
    def signature(self) -> tuple:
        options = LinearOptions(self.alpha, self.activation, self.keep, self.out_dtype)
        return signature_of(self.x, self.weight, self.bias, self.residual, self.lora, options, self.needs_grad)

    @property
    def rank(self) -> int:
        return 0 if self.lora is None else self.lora.a.shape[0]

    @property
    def inputs(self) -> tuple:
        """The custom op's inputs: (x, weight, bias, residual, lora_a, lora_b, alpha, lora_scale, activation, keep,
        out_dtype)."""
        la, lb, scale = (None, None, 1.0) if self.lora is None else (self.lora.a, self.lora.b, float(self.lora.scale))
        return (self.x, self.weight, self.bias, self.residual, la, lb, self.alpha, scale, self.activation, self.keep,
                self.out_dtype)

    @classmethod
    def from_inputs(cls, inputs: tuple) -> GemmCall:
        """The call of the custom op's ``inputs`` (:attr:`inputs`), derived without checks (they passed before)."""
        x, weight, bias, residual, lora_a, lora_b, alpha, lora_scale, activation, keep, out_dtype = inputs
        lora = None if lora_a is None else LoRA(lora_a, lora_b, lora_scale)
        return cls(x, weight, bias, residual, lora, alpha, activation, keep, out_dtype, keep != "nothing",
                   math.prod(x.shape[:-1]), weight.shape[0], weight.shape[1])


@dataclass(frozen=True)
class LinearBackward:
    """What the backward of :func:`fuselab.gemm` reads besides dY: the forward's saved tensors (x, weight, the kept
    output / pre-activation / ReLU bits, the LoRA factors and T = s·x·Aᵀ; None where no gradient needs them), its
    flags, and which gradients are wanted (x, weight, bias, dZ for the residual, lora_a, lora_b)."""

    x: torch.Tensor | None
    weight: torch.Tensor | None
    saved: torch.Tensor | None
    lora_a: torch.Tensor | None
    lora_b: torch.Tensor | None
    t: torch.Tensor | None
    alpha: float
    lora_scale: float
    activation: str
    keep: str
    want: tuple[bool, ...]

    @classmethod
    def from_inputs(cls, inputs: tuple) -> LinearBackward:
        """From the backward op's inputs after dY: (x, weight, saved, lora_a, lora_b, t, alpha, lora_scale,
        activation, keep, want)."""
        *head, want = inputs
        return cls(*head, tuple(bool(w) for w in want))

    @property
    def dtype(self) -> torch.dtype:
        return (self.x if self.x is not None else self.weight).dtype


def _check_lora(lora, n: int, k: int, dtype: torch.dtype) -> None:
    if not isinstance(lora, LoRA):
        raise TypeError(f"lora must be a fuselab.reference.gemm.LoRA(a, b, scale) or None, got {type(lora).__name__}")
    require_tensor("lora.a", lora.a)
    require_tensor("lora.b", lora.b)
    if lora.a.dim() != 2 or lora.a.shape[1] != k or not 1 <= lora.a.shape[0] <= MAX_LORA_RANK:
        raise ValueError(f"lora.a must have shape (rank, in_features) = (r, {k}) with 1 <= r <= {MAX_LORA_RANK}, "
                         f"got {tuple(lora.a.shape)}")
    rank = lora.a.shape[0]
    if lora.b.shape != (n, rank):
        raise ValueError(f"lora.b must have shape (out_features, rank) = ({n}, {rank}), got {tuple(lora.b.shape)}")
    for name, t in (("lora.a", lora.a), ("lora.b", lora.b)):
        if t.dtype != dtype:
            raise TypeError(f"{name} must have x's dtype {dtype}, got {t.dtype}")
    if isinstance(lora.scale, bool) or not isinstance(lora.scale, (int, float)):
        raise TypeError(f"lora.scale must be a Python float, got {type(lora.scale).__name__}")


def _check_options(options: LinearOptions) -> str:
    """The options' own checks; returns the activation."""
    if isinstance(options.alpha, bool) or not isinstance(options.alpha, (int, float)):
        raise TypeError(f"alpha must be a Python float, got {type(options.alpha).__name__}")
    activation = check_activation(options.activation)
    keep = options.keep
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {', '.join(KEEP_CHOICES)}, got {keep!r}")
    if keep == "mask" and activation != "relu":
        raise ValueError(f"keep='mask' needs activation='relu' (a 1-bit mask is relu's derivative), got {activation!r}")
    if keep == "output" and SAVED[activation] == "pre":
        raise ValueError(f"keep='output' cannot give the derivative of {activation!r}: use 'pre' or 'auto'")
    out = options.out_dtype
    if out is not None and out not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"out_dtype must be None or a floating dtype, got {out}")
    return activation


def validate(x, weight, bias, residual, lora, options: LinearOptions, needs_grad: bool) -> GemmCall:
    """The checks of :func:`fuselab.gemm` (TypeError/ValueError naming the argument) -> :class:`GemmCall`."""
    require_float("x", x)
    require_float("weight", weight)
    activation = _check_options(options)
    if x.dim() == 0:
        raise ValueError("x must have at least one dim (..., in_features), got a 0-dim tensor")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (out_features, in_features) with in_features = x.shape[-1] = "
                         f"{x.shape[-1]}, got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    n, k = weight.shape
    if bias is not None:
        require_float("bias", bias)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape (out_features,) = ({n},), got {tuple(bias.shape)}")
    if residual is not None:
        require_float("residual", residual)
        want = (*x.shape[:-1], n)
        if residual.shape != want:
            raise ValueError(f"residual must have shape {want} (x's leading dims, out_features), "
                             f"got {tuple(residual.shape)}")
    if lora is not None:
        _check_lora(lora, n, k, x.dtype)
    require_same_device(x=x, weight=weight, bias=bias, residual=residual, lora_a=None if lora is None else lora.a,
                        lora_b=None if lora is None else lora.b)
    return GemmCall(x=x, weight=weight, bias=bias, residual=residual, lora=lora, alpha=float(options.alpha),
                    activation=activation, keep=resolve_keep(activation, options.keep, needs_grad),
                    out_dtype=options.out_dtype or x.dtype, needs_grad=needs_grad, M=math.prod(x.shape[:-1]), N=n,
                    K=k)


def activation_id(name: str) -> int:
    """The kernels' id of an activation (its index in :data:`~fuselab.reference.bias_act.ACTIVATIONS`)."""
    return ACTIVATIONS.index(name)


# ---------------------------------------------------------------------------------------------- DCN
@dataclass(frozen=True)
class DcnCall:
    """A validated :func:`~fuselab.ops.gemm.dcn_cross` call and its sizes (``M`` rows, ``N`` features, ``rank`` of
    the low-rank form or ``N``)."""

    x0: torch.Tensor
    xl: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    weight_v: torch.Tensor | None
    M: int
    N: int
    rank: int

    @property
    def signature(self) -> tuple:
        """Every operand's shape, strides, dtype, device, storage offset and 16-byte alignment."""
        return tuple(None if t is None else operand(t) for t in self.inputs)

    @property
    def inputs(self) -> tuple:
        """The custom op's inputs: (x0, xl, weight, bias, weight_v)."""
        return self.x0, self.xl, self.weight, self.bias, self.weight_v


def validate_dcn(x0, xl, weight, bias, weight_v) -> DcnCall:
    """TypeError/ValueError naming the argument -> :class:`DcnCall`."""
    for name, t in (("x0", x0), ("xl", xl), ("weight", weight)):
        require_float(name, t)
    if xl.dim() == 0 or x0.shape != xl.shape:
        raise ValueError(f"x0 must have xl's shape (..., N), got x0 {tuple(x0.shape)} and xl {tuple(xl.shape)}")
    n = xl.shape[-1]
    for name, t in (("x0", x0), ("weight", weight), ("weight_v", weight_v)):
        if t is not None and t.dtype != xl.dtype:
            require_float(name, t)
            raise TypeError(f"{name} must have xl's dtype {xl.dtype}, got {t.dtype}")
    if weight_v is None:
        if weight.shape != (n, n):
            raise ValueError(f"weight must have shape (N, N) = ({n}, {n}) (full rank), got {tuple(weight.shape)}")
        rank = n
    else:
        if weight_v.dim() != 2 or weight_v.shape[1] != n:
            raise ValueError(f"weight_v must have shape (rank, N) = (r, {n}), got {tuple(weight_v.shape)}")
        rank = weight_v.shape[0]
        if weight.shape != (n, rank):
            raise ValueError(f"weight must have shape (N, rank) = ({n}, {rank}) with weight_v, got "
                             f"{tuple(weight.shape)}")
    if bias is not None:
        require_float("bias", bias)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape (N,) = ({n},), got {tuple(bias.shape)}")
    require_same_device(x0=x0, xl=xl, weight=weight, bias=bias, weight_v=weight_v)
    return DcnCall(x0, xl, weight, bias, weight_v, math.prod(xl.shape[:-1]), n, rank)


# ---------------------------------------------------------------------------------------------- QKV + RoPE
#: x's shape per layout (q, k and v come out in the layout; bhsd reads x as (batch, seq, hidden))
X_SHAPES = {"bshd": "(batch, seq, hidden)", "bhsd": "(batch, seq, hidden)", "sbhd": "(seq, batch, hidden)",
            "thd": "(total_tokens, hidden)"}


@dataclass(frozen=True)
class QkvCall:
    """A validated :func:`~fuselab.ops.gemm.qkv_rope` call: the projection's operands, the heads, and the rotation
    (tables or in-kernel angles ``freq`` with ``mscale``; positions, per-sequence offsets or an int offset; packed
    sequences)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layout: str
    interleaved: bool
    half: int
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    freq: torch.Tensor | None
    mscale: float
    positions: torch.Tensor | None
    offsets: torch.Tensor | None
    offset: int
    cu_seqlens: torch.Tensor | None

    @property
    def tensors(self) -> tuple:
        return (self.x, self.weight, self.bias, self.cos, self.sin, self.freq, self.positions, self.offsets,
                self.cu_seqlens)

    @property
    def scalars(self) -> tuple:
        return (self.layout, self.num_heads, self.num_kv_heads, self.half, self.interleaved, self.offset, self.mscale)

    @property
    def inputs(self) -> tuple:
        """The custom op's inputs: :attr:`tensors` then :attr:`scalars`."""
        return (*self.tensors, *self.scalars)

    @classmethod
    def from_inputs(cls, inputs: tuple) -> QkvCall:
        """The call of the custom op's ``inputs`` (:attr:`inputs`), derived without checks (they passed before)."""
        x, weight, bias, cos, sin, freq, positions, offsets, cu_seqlens, lay, heads, kv_heads, half, inter, offset, \
            mscale = inputs
        head_dim = weight.shape[0] // (heads + 2 * kv_heads)
        return cls(x, weight, bias, heads, kv_heads, head_dim, lay, inter, half, cos, sin, freq, mscale, positions,
                   offsets, offset, cu_seqlens)


def _q_like(x: torch.Tensor, lay: str, heads: int, head_dim: int) -> torch.Tensor:
    """A zero-stride tensor shaped like q (or k) in ``lay`` for x's tokens: what :func:`fuselab.apply_rope`'s checks
    read of q."""
    lead = x.shape[:-1]
    shape = (lead[0], heads, lead[1], head_dim) if lay == "bhsd" else (*lead, heads, head_dim)
    return x.new_empty(1).expand(shape)


def validate_qkv(x, weight, bias, num_heads: int, num_kv_heads: int, rope: Mapping[str, Any]) -> QkvCall:
    """TypeError/ValueError naming the argument -> :class:`QkvCall` (the RoPE options checked by
    :func:`fuselab.apply_rope`'s own checks)."""
    from fuselab.ops.rope.checks import RopeArgs, split_offsets  # imports Triton: on first use only
    from fuselab.ops.rope.checks import validate as rope_validate

    require_float("x", x)
    require_float("weight", weight)
    lay = rope.get("layout", "bshd")
    if lay not in X_SHAPES:
        raise ValueError(f"layout must be one of {', '.join(X_SHAPES)}, got {lay!r}")
    ndim = 2 if lay == "thd" else 3
    if x.dim() != ndim:
        raise ValueError(f"x must have {ndim} dims {X_SHAPES[lay]} for layout={lay!r}, got shape {tuple(x.shape)}")
    for name, h in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if isinstance(h, bool) or not isinstance(h, int) or h <= 0:
            raise ValueError(f"{name} must be a positive int, got {h!r}")
    heads = num_heads + 2 * num_kv_heads
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % heads:
        raise ValueError(f"weight must have shape ((num_heads + 2 * num_kv_heads) * head_dim, hidden) = "
                         f"({heads} * head_dim, {x.shape[-1]}), got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    head_dim = weight.shape[0] // heads
    if bias is not None:
        require_float("bias", bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    require_same_device(x=x, weight=weight, bias=bias)
    cos, sin = rope.get("cos"), rope.get("sin")
    q, k = _q_like(x, lay, num_heads, head_dim), _q_like(x, lay, num_kv_heads, head_dim)
    interleaved = bool(rope.get("interleaved", False))
    args = RopeArgs(q, k, cos, sin, interleaved=interleaved, positions=rope.get("positions"),
                    seqlen_offsets=rope.get("seqlen_offsets", 0), cu_seqlens=rope.get("cu_seqlens"),
                    max_seqlen=rope.get("max_seqlen"), base=rope.get("base", 10000.0), scaling=rope.get("scaling"),
                    rotary_dim=rope.get("rotary_dim"))
    checked = rope_validate(args, lay)
    half = checked.half
    offsets, offset = split_offsets(args.seqlen_offsets, args.positions)
    if not interleaved and (half & (half - 1) or head_dim % (2 * half)):
        raise ValueError(f"rotary_dim ({2 * half}) must be a power of 2 dividing head_dim ({head_dim}) for the "
                         f"half-split (neox) rotation in the epilogue; rotate with fuselab.apply_rope after "
                         f"fuselab.gemm otherwise")
    return QkvCall(x, weight, bias, num_heads, num_kv_heads, head_dim, lay, interleaved, half, cos, sin,
                   checked.inv_freq, float(checked.mscale), rope.get("positions"), offsets, offset,
                   rope.get("cu_seqlens"))
