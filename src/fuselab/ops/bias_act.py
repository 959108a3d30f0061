"""Fused bias + scaled residual + activation: ``y = act(x + alpha * residual + bias)``, forward and backward.

Layers: Triton kernels and out-param launchers (:mod:`fuselab.ops._bias_act_triton`) -> allocating ops
(:func:`_forward`, :func:`_backward`) -> ``torch.library.custom_op`` ``fuselab::bias_act_fwd`` /
``fuselab::bias_act_bwd`` / ``fuselab::bias_act_`` (in place) with fake kernels and ``register_autograd`` ->
the public :func:`bias_act`. Eager calls skip the dispatcher (host overhead): no grad goes straight to the
launcher, grad through :class:`_BiasActFunction`; under ``torch.compile`` the custom ops are always used.

What the backward keeps per element of ``x`` (see :data:`fuselab.reference.bias_act.SAVED`):
``none`` nothing; ``relu``/``relu2``/``sigmoid`` the output ``y`` (no extra memory when the next layer keeps
its input, as every Linear does); ``silu``/``gelu``/``gelu_tanh`` the pre-activation ``z`` in ``x``'s dtype
when there is a residual; without one, ``x`` itself (and the bias), from which the backward rebuilds
``z = x + bias``: no extra write in the forward.
"""

from __future__ import annotations

import functools

import torch

from fuselab.backend import triton_for, use_triton
from fuselab.ops._launch import keep, layout, operand
from fuselab.ops._validate import require_float, require_same_device, require_tensor
from fuselab.reference import bias_act as ref

ACTIVATIONS: tuple[str, ...] = ref.ACTIVATIONS

__all__ = ["ACTIVATIONS", "bias_act"]


def check_activation(activation: str) -> str:
    """``activation`` if it names one of :data:`ACTIVATIONS`; else ``ValueError`` listing them."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def _check(x, bias, residual, alpha, activation) -> None:
    require_tensor("x", x)
    require_float("x", x)
    check_activation(activation)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a Python float, got {type(alpha).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dim (..., N), got a 0-dim tensor")
    n = x.shape[-1]
    if bias is not None:
        require_float("bias", bias)
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"bias must have shape ({n},) (the last dim of x), got {tuple(bias.shape)}")
    if residual is not None:
        require_float("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    require_same_device(x=x, bias=bias, residual=residual)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[M, N]`` view (strides kept). Leading dims that cannot be merged without a copy
    (exotic >2-D strides) fall back to ``reshape``, i.e. a copy: documented limit."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t.reshape(-1, t.shape[-1])


def _needs_pre(activation: str, residual) -> bool:
    """The backward needs a separately stored pre-activation: z = x + alpha*r + b has a residual in it.
    (Without residual the backward rebuilds z = x + bias from the saved x: no extra write in the forward.)"""
    return ref.SAVED[activation] == "pre" and residual is not None


def _forward(x, bias, residual, alpha: float, activation: str, save_pre: bool,
             key: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Allocating forward: (y contiguous like x, z when ``save_pre`` else None).

    ``key`` (:func:`_call_key`, eager calls): keep the launch under it for :func:`_forward_again`, unless an
    operand had to be copied into rows (the launch then read the copy, not the caller's tensor)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    pre = torch.empty(x.shape, dtype=x.dtype, device=x.device) if save_pre else None
    if use_triton(x.device):
        from fuselab.ops._bias_act_triton import bias_act_fwd_

        n = x.shape[-1]
        x2, r2 = _rows(x), None if residual is None else _rows(residual)
        record = bias_act_fwd_(x2, bias, r2, y.view(-1, n), pre.view(-1, n) if save_pre else None, alpha, activation)
        if (key is not None and record is not None and x2.data_ptr() == x.data_ptr()
                and (residual is None or r2.data_ptr() == residual.data_ptr())):
            keep(_FORWARDS, key, record)
        return y, pre
    with torch.no_grad():
        acc = ref.compute_dtype(x.dtype)
        z = x.to(acc)
        if residual is not None:
            z = z + alpha * residual.to(acc)
        if bias is not None:
            z = z + bias.to(acc)
        y.copy_(ref.activation(z, activation))
        if save_pre:
            pre.copy_(z)
    return y, pre


#: forward launches of eager calls, by :func:`_call_key`: the launch record of
#: :func:`fuselab.ops._bias_act_triton.bias_act_fwd_`, kept by calls that passed the checks on the Triton path
_FORWARDS: dict[tuple, tuple] = {}


def _call_key(x, bias, residual, alpha, activation: str, needs_grad: bool) -> tuple:
    """Everything an eager call's checks and forward launch depend on besides tensor values: each operand's
    shape, strides, dtype, device, storage offset and 16-byte alignment, ``alpha``'s type, the activation and
    whether autograd records the call (it decides whether z is written). A call whose key a checked call
    kept skips the checks, the plan and the launch signature. Raises AttributeError/TypeError for
    non-tensor operands or an unhashable activation (the checks then name the argument)."""
    return (operand(x), type(alpha), activation, needs_grad, None if bias is None else operand(bias),
            None if residual is None else operand(residual))


def _forward_again(record: tuple, x, bias, residual, alpha: float, save_pre: bool) -> tuple:
    """:func:`_forward` through the launch a call of the same :func:`_call_key` kept: (y, z or None)."""
    from fuselab.ops._bias_act_triton import bias_act_fwd_again

    y = x.new_empty(x.shape)
    pre = x.new_empty(x.shape) if save_pre else None
    bias_act_fwd_again(record, x, bias, residual, y, pre, alpha)
    return y, pre


def _inplace(x, bias, residual, alpha: float, activation: str) -> None:
    if not use_triton(x.device):
        with torch.no_grad():
            x.copy_(ref.bias_act(x, bias, residual, alpha, activation))
        return
    from fuselab.ops._bias_act_triton import bias_act_fwd_

    r2 = None if residual is None else _rows(residual)
    try:
        x2 = x if x.dim() == 2 else x.view(-1, x.shape[-1])
    except RuntimeError:  # leading dims cannot be viewed as rows: compute into a buffer, copy back (documented)
        x2 = None
    if x2 is not None:
        bias_act_fwd_(x2, bias, r2, x2, None, alpha, activation)
    else:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        bias_act_fwd_(_rows(x), bias, r2, out.view(-1, x.shape[-1]), None, alpha, activation)
        x.copy_(out)


_EMPTY_DTYPE = torch.float32  # placeholder dtype for a gradient that is not wanted


def _backward(grad, saved, shift, alpha: float, activation: str, x_dtype, residual_dtype, bias_dtype,
              want_x: bool, want_residual: bool, want_bias: bool, prepare_key: tuple | None = None):
    """Allocating backward: (grad_x, grad_residual, grad_bias), empty tensors for those not wanted.

    ``prepare_key`` (eager autograd, see :class:`_BiasActFunction`): keep the launch under that key for later
    backwards whose gradient has this one's strides (contiguous, as the forward's output)."""
    n = grad.shape[-1]
    dev = grad.device
    empty = lambda: torch.empty(0, dtype=_EMPTY_DTYPE, device=dev)  # one per output: outputs may not alias
    if not use_triton(dev):
        if shift is not None:
            saved = saved.to(ref.compute_dtype(saved.dtype)) + shift.to(ref.compute_dtype(saved.dtype))
        gx, gr, gb = ref.bias_act_backward(grad, saved, alpha, activation, x_dtype if want_x else None,
                                           residual_dtype if want_residual else None,
                                           bias_dtype if want_bias else None)
        return tuple(empty() if t is None else t for t in (gx, gr, gb))
    from fuselab.ops._bias_act_triton import bias_act_bwd_, bias_grad_partials

    g2 = _rows(grad)
    m = g2.shape[0]
    gx = torch.empty(grad.shape, dtype=x_dtype, device=dev) if want_x else None
    gr = torch.empty(grad.shape, dtype=residual_dtype, device=dev) if want_residual else None
    gb = torch.empty(n, dtype=bias_dtype, device=dev) if want_bias else None
    partial = bias_grad_partials(m, n, grad.dtype, dev) if want_bias else None
    record = bias_act_bwd_(g2, None if saved is None else _rows(saved), shift, alpha, activation,
                           None if gx is None else gx.view(-1, n), None if gr is None else gr.view(-1, n), partial, gb)
    if (prepare_key is not None and record is not None and grad.is_contiguous() and g2.stride() == (n, 1)
            and grad.data_ptr() & 15 == 0 and (saved is None or saved.dim() == 2 or saved.is_contiguous())):
        keep(_PREPARED, prepare_key, (record, layout(grad)))
    return tuple(empty() if t is None else t for t in (gx, gr, gb))


@torch.library.custom_op("fuselab::bias_act_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, alpha: float,
            activation: str, save_pre: bool) -> tuple[torch.Tensor, torch.Tensor]:
    y, pre = _forward(x, bias, residual, alpha, activation, save_pre)
    return y, pre if pre is not None else x.new_empty((0,))  # custom ops return tensors


@_fwd_op.register_fake
def _(x, bias, residual, alpha, activation, save_pre):
    return x.new_empty(x.shape), x.new_empty(x.shape if save_pre else (0,))


@torch.library.custom_op("fuselab::bias_act_bwd", mutates_args=())
def _bwd_op(grad: torch.Tensor, saved: torch.Tensor | None, shift: torch.Tensor | None, alpha: float, activation: str,
            x_dtype: torch.dtype, residual_dtype: torch.dtype, bias_dtype: torch.dtype,
            want_x: bool, want_residual: bool, want_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(grad, saved, shift, alpha, activation, x_dtype, residual_dtype, bias_dtype,
                     want_x, want_residual, want_bias)


@_bwd_op.register_fake
def _(grad, saved, shift, alpha, activation, x_dtype, residual_dtype, bias_dtype, want_x, want_residual, want_bias):
    n = grad.shape[-1]
    empty = grad.new_empty(0, dtype=_EMPTY_DTYPE)
    return (grad.new_empty(grad.shape, dtype=x_dtype) if want_x else empty,
            grad.new_empty(grad.shape, dtype=residual_dtype) if want_residual else empty.clone(),
            grad.new_empty(n, dtype=bias_dtype) if want_bias else empty.clone())


def _setup_context(ctx, inputs, output):
    x, bias, residual, alpha, activation, save_pre = inputs
    y, pre = output
    if pre is not None:  # the custom op's second output (an empty tensor when z is not kept)
        ctx.mark_non_differentiable(pre)
    kind = ref.SAVED[activation]
    if kind == "output":
        ctx.save_for_backward(y)
    elif kind == "pre":
        if _needs_pre(activation, residual) and not save_pre:
            raise RuntimeError("fuselab::bias_act_fwd ran without save_pre but its backward needs z")
        if save_pre:
            ctx.save_for_backward(pre)
        else:  # the backward rebuilds z = x + bias
            ctx.save_for_backward(x, bias)
    else:
        ctx.save_for_backward()
    ctx.alpha, ctx.activation = alpha, activation
    ctx.dtypes = (x.dtype, (residual if residual is not None else x).dtype, (bias if bias is not None else x).dtype)
    ctx.present = (bias is not None, residual is not None)


def _input_grads(ctx, grad_y, backward) -> tuple:
    """Gradients of ``(x, bias, residual, alpha, activation, save_pre)`` through ``backward`` (the custom op
    under torch.compile, :func:`_backward` itself in eager autograd)."""
    saved_tensors = ctx.saved_tensors
    saved = saved_tensors[0] if saved_tensors else None
    shift = saved_tensors[1] if len(saved_tensors) > 1 else None
    has_bias, has_residual = ctx.present
    want_x = ctx.needs_input_grad[0]
    want_b = has_bias and ctx.needs_input_grad[1]
    want_r = has_residual and ctx.needs_input_grad[2]
    gx, gr, gb = backward(grad_y, saved, shift, ctx.alpha, ctx.activation, *ctx.dtypes, want_x, want_r, want_b)
    return (gx if want_x else None, gb if want_b else None, gr if want_r else None, None, None, None)


def _autograd_backward(ctx, grad_y, grad_pre):
    return _input_grads(ctx, grad_y, torch.ops.fuselab.bias_act_bwd)


torch.library.register_autograd("fuselab::bias_act_fwd", _autograd_backward, setup_context=_setup_context)


#: backward launches prepared by the eager autograd path: (:func:`_call_key`, needs_input_grad) -> (launch record of
#: :func:`fuselab.ops._bias_act_triton.bias_act_bwd_`, the gradient's :func:`~fuselab.ops._launch.layout`)
_PREPARED: dict[tuple, tuple] = {}


class _BiasActFunction(torch.autograd.Function):
    """Eager autograd straight to the allocating forward/backward. The custom-op dispatcher and its
    autograd wrapper cost tens of microseconds of host time per call, enough to starve the GPU on
    mid-sized tensors; ``torch.compile`` still traces ``fuselab::bias_act_fwd`` (no graph break).

    The backward runs on the autograd engine's thread, where each Python step costs several times its
    main-thread time (H100 machine: 166 µs vs 47 µs for the same backward). So the forward looks up a launch
    prepared by an earlier backward of the same layout (:data:`_PREPARED`), and the backward then allocates
    the gradients and repeats that launch (:func:`~fuselab.ops._bias_act_triton.bias_act_bwd_again`) when the
    incoming gradient has the expected dtype, strides and alignment; else it takes the general path, which
    prepares the launch for next time."""

    @staticmethod
    def forward(ctx, x, bias, residual, alpha, activation, save_pre, key, record):
        # ctx in forward (not a separate setup_context): Function.apply then skips binding default
        # arguments through inspect.signature, tens of microseconds per call
        if record is not None:
            y, pre = _forward_again(record, x, bias, residual, alpha, save_pre)
        else:
            y, pre = _forward(x, bias, residual, alpha, activation, save_pre, key)
        _setup_context(ctx, (x, bias, residual, alpha, activation, save_pre), (y, pre))
        # the call key covers what the backward launch depends on besides its gradient (expected laid out like y)
        ctx.key = key = None if key is None else (key, ctx.needs_input_grad[:3])
        ctx.prepared = _PREPARED.get(key)
        want_x, want_b, want_r = ctx.needs_input_grad[:3]
        ctx.wants = (want_x, want_b and bias is not None, want_r and residual is not None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        prepared = ctx.prepared
        if prepared is not None and layout(grad_y) == prepared[1]:
            return _again(ctx, grad_y, prepared[0])
        return *_input_grads(ctx, grad_y, functools.partial(_backward, prepare_key=ctx.key)), None, None


def _again(ctx, grad_y, record) -> tuple:
    """The backward through a prepared launch, gradients allocated as :func:`_backward` does (``empty_like``: the
    gradient is contiguous, and it is the cheapest allocation from Python)."""
    from fuselab.ops._bias_act_triton import bias_act_bwd_again

    saved_tensors = ctx.saved_tensors
    x_dtype, residual_dtype, bias_dtype = ctx.dtypes
    want_x, want_b, want_r = ctx.wants
    gx = torch.empty_like(grad_y) if want_x else None
    gr = None
    if want_r:
        gr = torch.empty_like(grad_y) if residual_dtype == x_dtype else torch.empty_like(grad_y, dtype=residual_dtype)
    gb = torch.empty(grad_y.shape[-1], dtype=bias_dtype, device=grad_y.device) if want_b else None
    bias_act_bwd_again(record, grad_y, saved_tensors[0] if saved_tensors else None,
                       saved_tensors[1] if len(saved_tensors) > 1 else None, ctx.alpha, gx, gr, gb)
    return gx, gb, gr, None, None, None, None, None


@torch.library.custom_op("fuselab::bias_act_", mutates_args=("x",))
def _inplace_op(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, alpha: float,
                activation: str) -> None:
    _inplace(x, bias, residual, alpha, activation)


@_inplace_op.register_fake
def _(x, bias, residual, alpha, activation):
    return None


def _requires_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def bias_act(
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    activation: str = "relu",
    inplace: bool = False,
) -> torch.Tensor:
    """``act(x + alpha * residual + bias)`` in one fused pass, differentiable.

    Args:
        x: ``(..., N)``, float32/bfloat16/float16 (float64 accepted, computed in float64), any strides.
        bias: ``(N,)`` or None, broadcast over the rows; may have another floating dtype than ``x``.
        residual: tensor of ``x``'s shape or None (e.g. a LoRA branch or a skip connection), any strides.
        alpha: Python float scaling ``residual``. It is a constant: no gradient flows to it.
        activation: one of :data:`ACTIVATIONS`: ``none``, ``relu``, ``relu2`` (relu squared), ``sigmoid``,
            ``silu``, ``gelu`` (exact, erf), ``gelu_tanh`` (tanh approximation).
        inplace: write the result into ``x`` and return ``x`` (inference only).

    Returns:
        ``y`` with ``x``'s shape and dtype, contiguous (when not in place). Math is float32 inside.

    Gradients flow to ``x``, ``residual`` (``alpha * grad``) and ``bias`` (fused column sum, deterministic).
    CUDA tensors run the Triton kernels, others the PyTorch reference (``FUSELAB_BACKEND`` overrides).
    A 2-D ``x`` (or one whose leading dims merge into rows without a copy) is read through its strides;
    other >2-D strided inputs are first copied by ``reshape``.

    Raises:
        TypeError: ``x``/``bias``/``residual`` not a floating tensor (integer dtypes), ``alpha`` not a float.
        ValueError: ``bias`` not of shape ``(N,)``; ``residual`` of another shape; unknown ``activation``
            (the message lists the valid ones); tensors on different devices; ``inplace=True`` when ``x``
            requires grad, or when grad mode is on and ``bias``/``residual`` require grad.
    """
    key = None
    if not inplace and not torch.compiler.is_compiling():
        try:
            needs_grad = _requires_grad(x, bias, residual)
            key = _call_key(x, bias, residual, alpha, activation, needs_grad)
            record = _FORWARDS.get(key)
        except (AttributeError, TypeError):  # not a tensor, an unhashable activation: _check names it
            key = record = None
        if record is not None and triton_for(x):  # a call of this layout passed the checks below before
            alpha = float(alpha)
            if not needs_grad:
                return _forward_again(record, x, bias, residual, alpha, False)[0]
            return _BiasActFunction.apply(x, bias, residual, alpha, activation,
                                          _needs_pre(activation, residual), key, record)
    _check(x, bias, residual, alpha, activation)
    alpha = float(alpha)
    if inplace:
        if x.requires_grad:
            raise ValueError("inplace=True on x that requires grad is unsafe; use inplace=False")
        if _requires_grad(bias, residual):
            raise ValueError("inplace=True does not support autograd: bias/residual require grad; "
                             "use inplace=False")
        if torch.compiler.is_compiling():
            torch.ops.fuselab.bias_act_(x, bias, residual, alpha, activation)
        else:
            _inplace(x, bias, residual, alpha, activation)
        return x
    needs_grad = _requires_grad(x, bias, residual)
    save_pre = needs_grad and _needs_pre(activation, residual)
    if not torch.compiler.is_compiling():
        if not use_triton(x.device):
            return ref.bias_act(x, bias, residual, alpha, activation)
        if not needs_grad:  # no autograd, no dispatcher: straight to the launcher
            return _forward(x, bias, residual, alpha, activation, False, key)[0]
        return _BiasActFunction.apply(x, bias, residual, alpha, activation, save_pre, key, None)
    return torch.ops.fuselab.bias_act_fwd(x, bias, residual, alpha, activation, save_pre)[0]
