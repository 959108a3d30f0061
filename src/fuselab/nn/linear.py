"""Layers built on the fused GEMM family and the fused epilogue.

* :class:`FusedLinear` — ``act(x @ W.T + b)``, a drop-in for ``nn.Linear`` followed by an activation
  (functional form: :func:`fused_linear`). Two implementations, picked per call by the shape rules of
  :class:`LinearRules` (``benchmarks/notes/gemm.md``, section "Rules"): :func:`fuselab.gemm` (matmul, bias and
  activation in one launch; the ReLU mask kept as bits for the backward, whose dZ pass reads them) where it wins,
  else cuBLAS's matmul + one fused bias/activation pass. ``backend="cuda"`` runs the latter as one C++ autograd node
  (:func:`fuselab.cuda.fused_linear`): the least host time in eager training.
* :class:`LoRALinear` — ``act(x @ W.T + b + (alpha/rank) · (x @ A.T) @ B.T)`` around a (frozen) ``nn.Linear``:
  by the same rules, one :func:`fuselab.gemm` launch with the LoRA product beside the main loop, or cuBLAS matmuls
  with the LoRA branch entering the epilogue as the scaled residual.

Both accept any leading dims ``(..., in_features)`` and the dtypes of :func:`fuselab.bias_act`.
In inference (no tensor requires grad) the epilogue runs in place on the fresh matmul output.
In eager training on the Triton path, :func:`fused_linear` is one autograd node per layer
(:data:`LINEAR`): host time, not GPU time, bounds small layers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from fuselab.backend import triton_for
from fuselab.core.activations import ACTIVATIONS, SAVED
from fuselab.ops._recordop import RecordOp, layout, operand
from fuselab.ops.bias_act import bias_act, check_activation
from fuselab.ops.bias_act.checks import BiasActCall
from fuselab.ops.bias_act.op import gradients as bias_act_gradients
from fuselab.ops.gemm import LoRA, gemm
from fuselab.ops.tuning import current

_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: FusedLinear backends: "auto" follows FUSELAB_BACKEND (Triton on CUDA, PyTorch elsewhere); "cuda" is the C++ node
LINEAR_BACKENDS = ("auto", "cuda")


@dataclass(frozen=True, eq=False)
class LinearRules:
    """When :class:`FusedLinear` and :class:`LoRALinear` run :func:`fuselab.gemm` (one launch) instead of cuBLAS +
    the epilogue kernel: operands of one of ``dtypes`` on the Triton path, at least ``min_rows`` rows (tokens,
    batch), ``min_out`` output and ``min_in`` input features, a LoRA rank of at most ``max_lora_rank``, and rows of x
    and of the weight that start on 16-byte boundaries unless there are at most ``unaligned_max_in`` input features
    (unaligned rows cannot be read through TMA or asynchronous copies: no pipelining).
    ``relu_keep``: what a fused relu layer keeps for its backward (``"mask"``: 1 bit per element; ``"output"``: y).
    A frozen dataclass read through :func:`fuselab.ops.tuning.current` (``override(LinearRules(...))`` changes it);
    the values and the measurements behind them: ``benchmarks/notes/gemm.md``, section "Rules"."""

    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
    min_rows: int = 2048
    min_out: int = 256
    min_in: int = 1
    max_lora_rank: int = 64
    unaligned_max_in: int = 4096
    relu_keep: str = "mask"

    def fused(self, rows: int, out_features: int, in_features: int, dtype: torch.dtype, rank: int = 0,
              aligned: bool = True) -> bool:
        """Whether a layer of these sizes and dtype takes :func:`fuselab.gemm` (``aligned``: x's and the weight's rows
        start on 16-byte boundaries)."""
        return (dtype in self.dtypes and rows >= self.min_rows and out_features >= self.min_out
                and in_features >= self.min_in and rank <= self.max_lora_rank
                and (aligned or in_features <= self.unaligned_max_in))

    def keep(self, activation: str) -> str:
        """The ``keep`` argument of :func:`fuselab.gemm` for ``activation``."""
        return self.relu_keep if activation == "relu" else "auto"


def _gemm_wins(x, weight: torch.Tensor, rank: int = 0) -> bool:
    """Whether :class:`LinearRules` pick :func:`fuselab.gemm` for this call (the Triton path, no autocast, well-formed
    2+-D operands of one dtype; anything else takes the other path, whose checks name bad arguments)."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dim() >= 1 and weight.dim() == 2
            and x.dtype == weight.dtype and x.shape[-1] == weight.shape[1]):
        return False
    if not triton_for(x) or torch.is_autocast_enabled(x.device.type):
        return False
    size = x.element_size()
    compiling = torch.compiler.is_compiling()  # no data pointers while tracing: the strides decide
    aligned = all(t.stride(-1) == 1 and (t.dim() < 2 or t.stride(-2) * size % 16 == 0)
                  and (compiling or t.data_ptr() % 16 == 0) for t in (x, weight))
    return current(LinearRules).fused(math.prod(x.shape[:-1]), weight.shape[0], weight.shape[1], x.dtype, rank,
                                      aligned)


def _any_requires_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_backend(backend: str) -> str:
    if backend not in LINEAR_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(LINEAR_BACKENDS)}, got {backend!r}")
    return backend


@functools.cache
def _cuda_fused_linear():
    """:func:`fuselab.cuda.fused_linear`, imported on first use (it imports Triton's launcher module)."""
    from fuselab.cuda import fused_linear as cuda_fused_linear

    return cuda_fused_linear


@functools.cache
def _launch() -> ModuleType:
    """The epilogue's launchers, imported on first use (Triton must not load before ``TRITON_INTERPRET`` is set)."""
    from fuselab.ops.bias_act import launch

    return launch


def _fast_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> bool:
    """Whether eager autograd can take :data:`LINEAR`: Triton path, one floating dtype, well-formed arguments.
    Anything else (errors included) takes the matmul + :func:`~fuselab.bias_act` path."""
    dtype, device = x.dtype, x.device
    return (activation in ACTIVATIONS and dtype in _FAST_DTYPES and weight.dtype == dtype
            and x.dim() >= 2 and weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and (bias is None or (bias.dtype == dtype and bias.dim() == 1 and bias.shape[0] == weight.shape[0]
                                  and bias.device == device))
            and _eager_triton(x))


def _eager_triton(x: torch.Tensor) -> bool:
    """The per-call part of :func:`_fast_path`: not compiling, the Triton backend for ``x``, no autocast."""
    return (not torch.compiler.is_compiling() and triton_for(x)
            and not torch.is_autocast_enabled(x.device.type))


# ---------------------------------------------------------------------------------------------- the op
def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, *,
             prepared=None) -> tuple:
    """``torch.mm`` + the fused epilogue launcher: ((y, h for the backward of silu/gelu/gelu_tanh else None),
    epilogue launch record). ``prepared``: repeat a kept epilogue launch."""
    x2 = x if x.dim() == 2 else x.flatten(0, -2)
    kind = SAVED[activation]
    if x.dim() == 2 and kind != "pre":
        h = y = torch.mm(x2, weight.t())
    else:  # y allocated in x's leading shape: a Function's output that is a view forbids later in-place ops
        y = x.new_empty((*x.shape[:-1], weight.shape[0]))
        h = torch.mm(x2, weight.t(), out=None if kind == "pre" else y.view(x2.shape[0], y.shape[-1]))
    y2 = y if y.dim() == 2 else y.view(h.shape)
    record = None
    if prepared is not None:
        _launch().write(prepared, (h, bias, None, 1.0), y2, None)
    elif bias is not None or kind != "nothing":
        record = _launch().plan(BiasActCall(activation), (h, bias, None, 1.0))
        _launch().write(record, (h, bias, None, 1.0), y2, None)
    return (y, h if kind == "pre" else None), record


def _setup_context(ctx, inputs, outputs) -> None:
    """Saved for the backward: ``x`` (if ``weight`` needs grad), ``weight`` (if ``x`` needs grad), and per
    :data:`fuselab.core.activations.SAVED`: the output ``y`` (relu, relu2, sigmoid: the epilogue runs in place
    on the matmul output), the matmul output ``h`` and ``bias`` as the shift that rebuilds ``z = h + bias``
    (silu, gelu, gelu_tanh), nothing (none). x and y themselves, not row views made here: in-place ops on them
    later fail the usual version check."""
    x, weight, bias, activation = inputs
    y, h = outputs
    if h is not None:
        ctx.mark_non_differentiable(h)
    kind = SAVED[activation]
    want_x, want_w = ctx.needs_input_grad[:2]
    ctx.save_for_backward(x if want_w else None, weight if want_x else None,
                          h if kind == "pre" else y if kind == "output" else None, bias if kind == "pre" else None)
    ctx.activation, ctx.x_shape = activation, x.shape


def _backward(ctx, grad_y: torch.Tensor, grad_h: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """dz (and the bias-grad column sum) in one :data:`fuselab.ops.bias_act.op.BACKWARD` launch, then two
    ``torch.mm``. No double backward: with ``create_graph=True`` the gradients are first-order only. ``grad_h``
    (of the non-differentiable matmul output) is ignored."""
    if torch.is_grad_enabled():
        return _backward_once(ctx, grad_y)
    return _gradients(ctx, grad_y)


def _gradients(ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight, saved, shift = ctx.saved_tensors
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    g = grad_y if grad_y.dim() == 2 else grad_y.reshape(-1, grad_y.shape[-1])  # any strides
    key = getattr(ctx, "key", None)
    if key is not None and len(ctx.x_shape) == 2:  # the launch kept for a contiguous 2-D gradient (see BACKWARD)
        key = ("linear", key, want_b, layout(grad_y))
    else:
        key = None
    dt = g.dtype
    if ctx.activation == "none":  # dz = grad_y: only the bias gradient (column sum) is left
        dz, grad_b = g, None
        if want_b:
            grad_b = bias_act_gradients(ctx, (g, None, None, 1.0, "none", dt, dt, dt, False, False, True), key)[2]
    else:
        dz, _, grad_b = bias_act_gradients(
            ctx, (g, saved, shift, 1.0, ctx.activation, dt, dt, dt, True, False, want_b), key)
    grad_x = None
    if want_x:
        grad_x = dz.mm(weight)
        grad_x = grad_x if len(ctx.x_shape) == 2 else grad_x.view(ctx.x_shape)
    grad_w = dz.t().mm(x if x.dim() == 2 else x.flatten(0, -2)) if want_w else None
    return grad_x, grad_w, grad_b, None


_backward_once = once_differentiable(_gradients)


def _composite(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """What ``torch.compile`` and the general path run: ``torch.matmul`` + :func:`~fuselab.bias_act` (its own
    custom ops and autograd), in place on the matmul output when nothing needs grad."""
    h = torch.matmul(x, weight.t())
    return bias_act(h, bias, activation=activation, inplace=not _any_requires_grad(x, weight, bias))


#: ``act(x @ weight.T + bias)`` as one eager autograd node (the eager path of training on the Triton backend)
LINEAR = RecordOp("fuselab::fused_linear", eager=_forward, autograd=(_setup_context, _backward),
                  differentiable=(0, 1, 2), composite=_composite)


def _call_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> tuple:
    """What :func:`_fast_path`'s checks and the epilogue launch depend on: shapes, dtypes, devices, the bias's
    layout and the activation (the epilogue reads the fresh, contiguous matmul output, not ``x``). Raises
    AttributeError/TypeError for non-tensors or an unhashable activation."""
    return (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device,
            None if bias is None else operand(bias), activation)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str = "relu") -> torch.Tensor:
    """Functional :class:`FusedLinear`: ``act(x @ weight.T + bias)``, matmul without bias + fused epilogue.

    ``x`` ``(..., in)``, ``weight`` ``(out, in)``, ``bias`` ``(out,)`` or None. Where :class:`LinearRules` pick it,
    :func:`fuselab.gemm` (one forward launch; its backward plan: dZ in one pass, cuBLAS's products). Otherwise: in
    inference (nothing requires grad) the epilogue runs in place on the fresh matmul output; eager training on the
    Triton path with one dtype (x of 2+ dims, no autocast) runs :data:`LINEAR`; torch.compile traces the matmul and
    the custom ops.
    """
    if activation in ACTIVATIONS and _gemm_wins(x, weight):
        return gemm(x, weight, bias, activation=activation, keep=current(LinearRules).keep(activation))
    if _any_requires_grad(x, weight, bias) and not torch.compiler.is_compiling():
        try:
            key = _call_key(x, weight, bias, activation)
            prepared = LINEAR.launches.get(key)
        except (AttributeError, TypeError):  # not tensors, an unhashable activation: the general path names it
            key = prepared = None
        # a kept key passed the checks of _fast_path; what may change between calls is checked again
        if prepared is not None and _eager_triton(x):
            return LINEAR.run((x, weight, bias, activation), key, prepared, True)[0]
        if _fast_path(x, weight, bias, activation):
            return LINEAR.run((x, weight, bias, activation), key, None, True)[0]
    return _composite(x, weight, bias, activation)


class FusedLinear(nn.Module):
    """``y = act(x @ W.T + b)``: :func:`fuselab.gemm` where :class:`LinearRules` pick it, else ``torch.matmul``
    without bias (cuBLAS) + the fused epilogue (see :func:`fused_linear`).

    Parameters are named and initialized like ``nn.Linear`` (``weight`` ``[out, in]``, ``bias`` ``[out]``,
    Kaiming-uniform), so ``load_state_dict`` from an ``nn.Linear`` works.

    ``backend``:

    * ``"auto"`` (default): the op's dispatch (``FUSELAB_BACKEND``): on CUDA the Triton epilogue, one Python
      autograd node per layer in eager training and custom ops under ``torch.compile``; the PyTorch path on CPU.
    * ``"cuda"``: :func:`fuselab.cuda.fused_linear`, one C++ autograd node (no Python in the backward; the
      extension compiles with nvcc on first use). For eager training of small, host-bound layers. CUDA tensors
      of float32/float16/bfloat16 only; ``torch.compile`` graph-breaks around it.

    Raises ``ValueError`` for an unknown activation or backend, or non-positive sizes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "relu",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 backend: str = "auto") -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = check_activation(activation)
        self.backend = _check_backend(backend)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # the nn.Linear initialization
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "relu", backend: str = "auto") -> FusedLinear:
        """A FusedLinear sharing ``linear``'s parameters."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.activation = check_activation(activation)
        layer.backend = _check_backend(backend)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raises ValueError when ``x``'s last dim is not ``in_features``."""
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., {self.in_features}), got {tuple(x.shape)}")
        if self.backend == "cuda":
            return _cuda_fused_linear()(x, self.weight, self.bias, self.activation)
        return fused_linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        backend = "" if self.backend == "auto" else f", backend={self.backend!r}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}{backend}")


class LoRALinear(nn.Module):
    """``act(x @ W.T + b + (alpha / rank) · (x @ A.T) @ B.T)`` with the sum, scale, bias and activation fused.

    Args:
        base: the ``nn.Linear`` to adapt; its parameters are frozen (``requires_grad=False``) unless
            ``freeze_base=False``.
        rank: LoRA rank r > 0. ``lora_A`` ``[r, in]`` is Kaiming-uniform (like ``nn.Linear``), ``lora_B``
            ``[out, r]`` starts at zero (the LoRA convention: the layer starts equal to ``base``).
        alpha: LoRA alpha; the branch is scaled by ``alpha / rank`` (a constant: no gradient).
        activation: one of :data:`fuselab.ACTIVATIONS` (``"none"`` for a plain adapted linear).

    Raises ``TypeError`` when ``base`` is not an ``nn.Linear``; ``ValueError`` for ``rank <= 0`` or an
    unknown activation.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 1.0, activation: str = "none",
                 freeze_base: bool = True) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be an nn.Linear, got {type(base).__name__}")
        if not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        self.base = base
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = self.alpha / rank
        self.activation = check_activation(activation)
        if freeze_base:
            base.requires_grad_(False)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One :func:`fuselab.gemm` launch where :class:`LinearRules` pick it, else cuBLAS matmuls + the epilogue."""
        if _gemm_wins(x, self.base.weight, self.rank) and self.lora_A.dtype == x.dtype:
            lora = LoRA(self.lora_A, self.lora_B, self.scaling)
            return gemm(x, self.base.weight, self.base.bias, activation=self.activation, lora=lora,
                        keep=current(LinearRules).keep(self.activation))
        h = torch.matmul(x, self.base.weight.t())
        lora = torch.matmul(torch.matmul(x, self.lora_A.t()), self.lora_B.t())
        inplace = not _any_requires_grad(x, self.base.weight, self.base.bias, self.lora_A, self.lora_B)
        return bias_act(h, self.base.bias, residual=lora, alpha=self.scaling, activation=self.activation,
                        inplace=inplace)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, activation={self.activation!r}"
