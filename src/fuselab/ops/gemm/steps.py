"""The launch sequences of the GEMM ops on the Triton path: which launches of :func:`~fuselab.ops.gemm.launch.gemm_`
each forward and backward makes, on which operand views (imports Triton: loaded through :mod:`.lazy`)."""

from __future__ import annotations

import torch

from fuselab.ops.tuning import current
from fuselab.reference.bias_act import activation_grad
from fuselab.reference.gemm import unpack_bits

from .checks import GemmCall, LinearBackward, activation_id, rows, tf32_enabled
from .launch import gemm_, plan, spec_of
from .spec import GemmOperands, GemmPlan, GemmTuning, RopeArgs, RopeSpec

#: kept-tensor kinds -> the kernels' KEEP ids
KEEP_IDS = {"nothing": 0, "output": 0, "pre": 1, "mask": 2}


def run(ops: GemmOperands, **flags) -> GemmPlan:
    """Plan and launch one GEMM on ``ops`` (``flags``: :class:`~fuselab.ops.gemm.launch.GemmSpec`'s)."""
    p = plan(spec_of(ops, tf32=tf32_enabled(), **flags))
    gemm_(p, ops)
    return p


def prologue_flags(keep: str, activation: str) -> dict:
    """The prologue that forms dZ from dY as it is loaded, for what the forward kept."""
    if keep == "mask":
        return {"pro_mask": True}
    if keep in ("output", "pre"):
        return {"pro_act": activation_id(activation)}
    return {}


# ---------------------------------------------------------------------------------------------- linear
def linear_forward(call: GemmCall, y2: torch.Tensor, kept: torch.Tensor, t: torch.Tensor | None,
                   prepared: GemmPlan | None) -> GemmPlan:
    """The forward's one launch into ``y2`` ``[M, N]`` (and ``kept``, ``t``); returns its plan, which a later call of
    the same key passes back as ``prepared``."""
    lora = call.lora
    ops = GemmOperands(a=rows(call.x), b=call.weight.t(), c=y2, bias=call.bias, kept=kept if kept.numel() else None,
                       res=None if call.residual is None else rows(call.residual), alpha=call.alpha,
                       l1=None if lora is None else lora.a.t(), l2=None if lora is None else lora.b.t(), t=t,
                       lora_scale=1.0 if lora is None else lora.scale)
    if prepared is not None:
        gemm_(prepared, ops)
        return prepared
    return run(ops, act=activation_id(call.activation), bias=call.bias is not None,
               residual=call.residual is not None, keep=KEEP_IDS[call.keep], lora_rank=call.rank)


def _dz_torch(g: torch.Tensor, saved: torch.Tensor | None, keep: str, activation: str) -> torch.Tensor:
    """dZ = dY ⊙ act' with PyTorch ops (the rare cases that need dZ without the dX launch)."""
    gf = g.float() if g.dtype != torch.float64 else g
    if keep == "mask":
        return (gf * unpack_bits(saved, g.shape[1])).to(g.dtype)
    if keep in ("output", "pre"):
        return (gf * activation_grad(rows(saved), activation)).to(g.dtype)
    return g


def linear_backward(grad: torch.Tensor, saved_for: LinearBackward) -> tuple:
    """(dx [M, K], dw [N, K], db [N] in the accumulator dtype, dz [M, N], da, dlb): those in ``want`` (x, weight,
    bias, dZ for the residual, lora_a, lora_b), empty tensors for the others. dZ is asked only where it differs
    from dY (an activation): the outputs never alias the inputs or each other (a custom op's rule)."""
    bw = saved_for
    x, weight, saved, lora_a, lora_b, t = bw.x, bw.weight, bw.saved, bw.lora_a, bw.lora_b, bw.t
    keep, activation, lora_scale, want = bw.keep, bw.activation, bw.lora_scale, bw.want
    want_x, want_w, want_b, want_r, want_a, want_lb = want
    dtype = bw.dtype
    g = rows(grad if grad.dtype == dtype else grad.to(dtype))
    m, n = g.shape
    k = (x if x is not None else weight).shape[-1]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if g.numel() == 0 or k == 0:
        return _empty_grads(g, k, lora_a, acc, want, _dz_torch(g, saved, keep, activation))
    pro = prologue_flags(keep, activation)
    s = None if not pro else saved if keep == "mask" else rows(saved)
    tuning = current(GemmTuning)
    need_dz = bool(pro) and (want_r or tuning.materialize_dz or (want_b and not want_w and not want_lb))
    dz = g.new_empty((m, n)) if need_dz and want_x else None
    rank = 0 if lora_a is None else lora_a.shape[0]
    u = g.new_empty((m, rank)) if rank and (want_x or want_a) else None
    dx = g.new_empty((m, k)) if want_x else g.new_empty(0)
    if want_x:  # dX = dZ·W + U·A, U = s·dZ·B beside the main loop; dZ written once where asked
        run(GemmOperands(a=g, b=weight, c=dx, s=s, aout=dz, l1=lora_b, l2=lora_a, t=u, lora_scale=lora_scale),
            lora_rank=rank, write_a=dz is not None, **pro)
    elif u is not None:  # U alone: dZ·(s·B)
        run(GemmOperands(a=g, b=lora_b * lora_scale, c=u, s=s), **pro)
    if need_dz and dz is None:
        dz = _dz_torch(g, saved, keep, activation)
    src, wpro = (dz, {}) if dz is not None else (g, pro)
    s_t = None if not wpro else s if keep == "mask" else s.t()
    db = g.new_empty(n, dtype=acc) if want_b else g.new_empty(0)
    dw = g.new_empty((n, k)) if want_w else g.new_empty(0)
    x2 = rows(x) if x is not None else None
    if want_w:  # dW = dZᵀ·x; the bias gradient as the row sums of dZᵀ
        run(GemmOperands(a=src.t(), b=x2, c=dw, s=s_t, db=db if want_b else None), n_along_p=True,
            row_sum=want_b, **wpro)
    dlb = g.new_empty((n, rank)) if want_lb else g.new_empty(0)
    if want_lb:  # dB = dZᵀ·T
        run(GemmOperands(a=src.t(), b=t, c=dlb, s=s_t, db=db if want_b and not want_w else None), n_along_p=True,
            row_sum=want_b and not want_w, **wpro)
    da = g.new_empty((rank, k)) if want_a else g.new_empty(0)
    if want_a:  # dA = Uᵀ·x
        run(GemmOperands(a=u.t(), b=x2, c=da), n_along_p=True)
    if want_b and not (want_w or want_lb):
        db = src.sum(0, dtype=acc)
    return dx, dw, db, dz if want_r else g.new_empty(0), da, dlb


def _empty_grads(g: torch.Tensor, k: int, lora_a, acc: torch.dtype, want: tuple[bool, ...], dz: torch.Tensor) -> tuple:
    """The gradients of a problem without rows or without input features: zeros, but the bias and residual
    gradients of ``act(bias + alpha·r)`` when there are rows and no features (dZ itself, its column sums)."""
    m, n = g.shape
    rank = 0 if lora_a is None else lora_a.shape[0]
    out = [g.new_zeros(shape) if w else g.new_empty(0)
           for w, shape in zip(want, ((m, k), (n, k), (n,), (m, n), (rank, k), (n, rank)))]
    if want[2]:
        out[2] = dz.sum(0, dtype=acc)
    if want[3]:
        out[3] = dz
    return tuple(out)


# ---------------------------------------------------------------------------------------------- DCN cross layer
def dcn_forward(x0: torch.Tensor, xl: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                weight_v: torch.Tensor | None, y: torch.Tensor, h: torch.Tensor | None) -> None:
    """y = x0 ⊙ (h Wᵀ + b) + xl with h = xl Vᵀ written first (low rank) or h = xl: one or two launches."""
    xl2 = rows(xl)
    if weight_v is not None:
        run(GemmOperands(a=xl2, b=weight_v.t(), c=h))
    run(GemmOperands(a=xl2 if h is None else h, b=weight.t(), c=y, bias=bias, x0=rows(x0), res=xl2),
        bias=bias is not None, x0=True, residual=True)


def dcn_backward(grad, x0, xl, weight, bias, weight_v, h, want: list[bool]) -> tuple:
    """(dx0, dxl, dw, db [acc dtype], dv) of :func:`dcn_forward` (empty where not in ``want``): dx0 = g ⊙ (h Wᵀ + b)
    recomputed by the forward's epilogue with g as the multiplier; dT = (g ⊙ x0)·W with the product formed as g is
    loaded; dW = (g ⊙ x0)ᵀ·h with the bias gradient as its row sums; dxl = g + dT·V (low rank) or g + (g ⊙ x0)·W,
    the g added in the epilogue; dV = dTᵀ·xl."""
    want_x0, want_xl, want_w, want_b, want_v = want
    g = rows(grad)
    x02, xl2 = rows(x0), rows(xl)
    hh = xl2 if h is None else h
    m, n = g.shape
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    out = [g.new_empty(0) for _ in range(5)]
    if want_x0:
        out[0] = g.new_empty((m, n))
        run(GemmOperands(a=hh, b=weight.t(), c=out[0], bias=bias, x0=g), bias=bias is not None, x0=True)
    if weight_v is None and want_xl:
        out[1] = g.new_empty((m, n))
        run(GemmOperands(a=g, b=weight, c=out[1], g0=x02, res=g), pro_x0=True, residual=True)
    dt = None
    if weight_v is not None and (want_xl or want_v):
        dt = g.new_empty((m, weight.shape[1]))
        run(GemmOperands(a=g, b=weight, c=dt, g0=x02), pro_x0=True)
    if want_b:
        out[3] = g.new_empty(n, dtype=acc)
    if want_w:
        out[2] = g.new_empty(weight.shape)
        run(GemmOperands(a=g.t(), b=hh, c=out[2], g0=x02.t(), db=out[3] if want_b else None), pro_x0=True,
            n_along_p=True, row_sum=want_b)
    elif want_b:
        out[3] = (g.to(acc) * x02.to(acc)).sum(0)
    if dt is not None and want_xl:
        out[1] = g.new_empty((m, n))
        run(GemmOperands(a=dt, b=weight_v, c=out[1], res=g), residual=True)
    if dt is not None and want_v:
        out[4] = g.new_empty(weight_v.shape)
        run(GemmOperands(a=dt.t(), b=xl2, c=out[4]), n_along_p=True)
    return tuple(out)


# ---------------------------------------------------------------------------------------------- QKV + RoPE
def qkv_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                rope: RopeSpec, args: RopeArgs) -> None:
    """out = rope(x Wᵀ + b) on the q and k columns of the fused projection: one launch."""
    run(GemmOperands(a=x2, b=weight.t(), c=out, bias=bias, rope=args), bias=bias is not None, rope=rope)


def qkv_backward(grad: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rope: RopeSpec, args: RopeArgs,
                 want: list[bool]) -> tuple:
    """(dx [M, K], dw, db [acc dtype]) with dZ = R⁻¹(dY) formed as dY is loaded (the inverse rotation of the q and
    k columns): dX = dZ·W and dW = dZᵀ·x, the bias gradient the row sums of the latter."""
    want_x, want_w, want_b = want
    g = grad
    m, n = g.shape
    k = weight.shape[1]
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    dx, dw, db = (g.new_empty((m, k)) if want_x else g.new_empty(0), g.new_empty((n, k)) if want_w else g.new_empty(0),
                  g.new_empty(n, dtype=acc) if want_b else g.new_empty(0))
    if want_x:
        run(GemmOperands(a=g, b=weight, c=dx, rope=args), pro_rope=rope)
    if want_w or want_b:
        target = dw if want_w else g.new_empty((n, 1))  # the bias alone: row sums beside a one-column product
        b = x2 if want_w else x2[:, :1]
        run(GemmOperands(a=g.t(), b=b, c=target, db=db if want_b else None, rope=args), pro_rope=rope,
            n_along_p=True, row_sum=want_b)
    return dx, dw, db
