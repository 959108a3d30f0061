"""Layers built on the fused epilogue: cuBLAS matmul (no bias) + one fused bias/residual/activation pass.

* :class:`FusedLinear` — ``act(x @ W.T + b)``, a drop-in for ``nn.Linear`` followed by an activation
  (functional form: :func:`fused_linear`). ``backend="cuda"`` runs it as one C++ autograd node
  (:func:`fuselab.cuda.fused_linear`): the least host time in eager training.
* :class:`LoRALinear` — ``act(x @ W.T + b + (alpha/rank) · (x @ A.T) @ B.T)`` around a (frozen) ``nn.Linear``;
  the LoRA branch enters the epilogue as the scaled residual, so the sum never takes its own pass.

Both accept any leading dims ``(..., in_features)`` and the dtypes of :func:`fuselab.bias_act`.
In inference (no tensor requires grad) the epilogue runs in place on the fresh matmul output.
In eager training on the Triton path, :func:`fused_linear` is one autograd node per layer
(:class:`_FusedLinearFunction`): host time, not GPU time, bounds small layers.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from fuselab.backend import triton_for
from fuselab.ops._launch import keep, layout, operand
from fuselab.ops.bias_act import ACTIVATIONS, bias_act, check_activation
from fuselab.reference.bias_act import SAVED

_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: FusedLinear backends: "auto" follows FUSELAB_BACKEND (Triton on CUDA, PyTorch elsewhere); "cuda" is the C++ node
LINEAR_BACKENDS = ("auto", "cuda")


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
def _kernels() -> ModuleType:
    """The Triton launchers, imported on first use (triton must not load before TRITON_INTERPRET is set)."""
    from fuselab.ops import _bias_act_triton

    return _bias_act_triton


def _fast_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> bool:
    """Whether eager autograd can take :class:`_FusedLinearFunction`: Triton path, one floating dtype,
    well-formed arguments. Anything else (errors included) takes the custom-op path."""
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


class _FusedLinearFunction(torch.autograd.Function):
    """``act(x @ weight.T + bias)`` as one autograd node: ``torch.mm`` + the fused epilogue launcher forward,
    the fused backward launcher (dz and the bias-grad column sum in one pass) + two ``torch.mm`` backward.

    Saved for the backward: ``x`` (if ``weight`` needs grad), ``weight`` (if ``x`` needs grad), and per
    :data:`fuselab.reference.bias_act.SAVED`: the output ``y`` (relu, relu2, sigmoid: the epilogue runs in place
    on the matmul output), the matmul output ``h`` and ``bias`` as the shift that rebuilds ``z = h + bias``
    (silu, gelu, gelu_tanh: ``y`` is a new tensor), nothing (none). No double backward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                key: tuple | None, record: tuple | None) -> torch.Tensor:
        # key: the call's _call_key; record: the epilogue launch an earlier call of that key kept (or None)
        # ctx in forward (no setup_context): Function.apply then skips binding defaults via inspect.signature
        x2 = x if x.dim() == 2 else x.flatten(0, -2)
        kind = SAVED[activation]
        if x.dim() == 2 and kind != "pre":
            h = y = torch.mm(x2, weight.t())
        else:  # y allocated in x's leading shape: a Function's output that is a view forbids later in-place ops
            y = x.new_empty((*x.shape[:-1], weight.shape[0]))
            h = torch.mm(x2, weight.t(), out=None if kind == "pre" else y.view(x2.shape[0], y.shape[-1]))
        y2 = y if y.dim() == 2 else y.view(h.shape)
        if record is not None:
            _kernels().bias_act_fwd_again(record, h, bias, None, y2, None, 1.0)
        elif bias is not None or kind != "nothing":
            record = _kernels().bias_act_fwd_(h, bias, None, y2, None, 1.0, activation)
            if key is not None and record is not None:
                keep(_FORWARDS, key, record)
        # x and y, not row views made here: in-place ops on them later fail the usual version check
        want_x, want_w = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if want_w else None, weight if want_x else None,
                              h if kind == "pre" else y if kind == "output" else None,
                              bias if kind == "pre" else None)
        ctx.activation, ctx.x_shape, ctx.dtype = activation, x.shape, x.dtype
        # the backward's launch, prepared by an earlier backward of this layout (2-D x only; see _again): the
        # call key holds what it depends on besides its gradient (expected contiguous, laid out like y)
        ctx.key = None if key is None or x.dim() != 2 else (key, ctx.needs_input_grad[2])
        ctx.prepared = _PREPARED.get(ctx.key)
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: first-order grads, an error if differentiated again
            return *_backward_once(ctx, grad_y), None, None
        prepared = ctx.prepared
        if prepared is not None and layout(grad_y) == prepared[1]:
            return *_again(ctx, grad_y, prepared[0]), None, None
        return *_backward(ctx, grad_y), None, None


#: epilogue launches of eager training calls, by :func:`_call_key`: the launch record of
#: :func:`fuselab.ops._bias_act_triton.bias_act_fwd_`, kept by calls that passed :func:`_fast_path`
_FORWARDS: dict[tuple, tuple] = {}


def _call_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> tuple:
    """What :func:`_fast_path`'s checks and the epilogue launch depend on: shapes, dtypes, devices, the bias's
    layout and the activation (the epilogue reads the fresh, contiguous matmul output, not ``x``). Raises
    AttributeError/TypeError for non-tensors or an unhashable activation."""
    return (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device,
            None if bias is None else operand(bias), activation)


#: backward launches prepared by :func:`_backward` for :func:`_again`: ``ctx.key`` -> (launch record of
#: :func:`fuselab.ops._bias_act_triton.bias_act_bwd_`, the gradient's :func:`~fuselab.ops._launch.layout`)
_PREPARED: dict[tuple | None, tuple] = {}


def _again(ctx, grad_y: torch.Tensor, record: tuple) -> tuple[torch.Tensor | None, ...]:
    """:func:`_backward` for a 2-D contiguous ``grad_y`` through the launch an earlier backward of the same
    layout prepared: the backward runs on the autograd engine's thread, where every Python step costs several
    times its main-thread time, so it skips the launch plan and the argument checks."""
    x, weight, saved, shift = ctx.saved_tensors
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    grad_b = torch.empty(grad_y.shape[1], dtype=grad_y.dtype, device=grad_y.device) if want_b else None
    if ctx.activation == "none":
        dz = grad_y
        _kernels().bias_act_bwd_again(record, grad_y, None, None, 1.0, None, None, grad_b)
    else:
        dz = torch.empty_like(grad_y)
        _kernels().bias_act_bwd_again(record, grad_y, saved, shift, 1.0, dz, None, grad_b)
    return dz.mm(weight) if want_x else None, dz.t().mm(x) if want_w else None, grad_b, None


def _backward(ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight, saved, shift = ctx.saved_tensors
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    g = grad_y if grad_y.dim() == 2 else grad_y.reshape(-1, grad_y.shape[-1])  # any strides
    (m, n), dev, k = g.shape, g.device, _kernels()
    if saved is not None and saved.dim() != 2:
        saved = saved.view(m, n)
    grad_b = partial = None
    if want_b:
        grad_b = torch.empty(n, dtype=g.dtype, device=dev)
        partial = k.bias_grad_partials(m, n, g.dtype, dev)
    record = None
    if ctx.activation == "none":  # dz = grad_y: only the bias gradient (column sum) is left
        dz = g
        if want_b:
            record = k.bias_act_bwd_(g, None, None, 1.0, "none", None, None, partial, grad_b)
    else:
        dz = torch.empty((m, n), dtype=g.dtype, device=dev)
        record = k.bias_act_bwd_(g, saved, shift, 1.0, ctx.activation, dz, None, partial, grad_b)
    if (record is not None and ctx.key is not None and grad_y.dtype == ctx.dtype and grad_y.is_contiguous()
            and grad_y.stride() == (n, 1) and grad_y.data_ptr() & 15 == 0):
        keep(_PREPARED, ctx.key, (record, layout(grad_y)))
    grad_x = None
    if want_x:
        grad_x = dz.mm(weight)
        grad_x = grad_x if len(ctx.x_shape) == 2 else grad_x.view(ctx.x_shape)
    grad_w = dz.t().mm(x if x.dim() == 2 else x.flatten(0, -2)) if want_w else None
    return grad_x, grad_w, grad_b, None


_backward_once = once_differentiable(_backward)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str = "relu") -> torch.Tensor:
    """Functional :class:`FusedLinear`: ``act(x @ weight.T + bias)``, matmul without bias + fused epilogue.

    ``x`` ``(..., in)``, ``weight`` ``(out, in)``, ``bias`` ``(out,)`` or None. In inference (nothing requires
    grad) the epilogue runs in place on the fresh matmul output. Eager training on the Triton path with one
    dtype (x of 2+ dims, no autocast) runs :class:`_FusedLinearFunction`; torch.compile traces the custom ops.
    """
    needs_grad = _any_requires_grad(x, weight, bias)
    if needs_grad and not torch.compiler.is_compiling():
        try:
            key = _call_key(x, weight, bias, activation)
            record = _FORWARDS.get(key)
        except (AttributeError, TypeError):  # not tensors, an unhashable activation: the general path names it
            key = record = None
        # a kept key passed the checks of _fast_path; what may change between calls is checked again
        if record is not None and _eager_triton(x):
            return _FusedLinearFunction.apply(x, weight, bias, activation, key, record)
        if _fast_path(x, weight, bias, activation):
            return _FusedLinearFunction.apply(x, weight, bias, activation, key, None)
    h = torch.matmul(x, weight.t())
    return bias_act(h, bias, activation=activation, inplace=not needs_grad)


class FusedLinear(nn.Module):
    """``y = act(x @ W.T + b)``: ``torch.matmul`` without bias (cuBLAS) + the fused epilogue.

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
        h = torch.matmul(x, self.base.weight.t())
        lora = torch.matmul(torch.matmul(x, self.lora_A.t()), self.lora_B.t())
        inplace = not _any_requires_grad(x, self.base.weight, self.base.bias, self.lora_A, self.lora_B)
        return bias_act(h, self.base.bias, residual=lora, alpha=self.scaling, activation=self.activation,
                        inplace=inplace)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, activation={self.activation!r}"
