"""The launch sequences of the GEMM ops on the Triton path: which launches of :func:`~fuselab.ops.gemm.launch.gemm_`
and of the elementwise pass (:func:`~fuselab.ops.gemm.launch.pass_`) each forward and backward makes, on which operand
views, and which products go to cuBLAS (``torch.mm``) under :class:`~fuselab.ops.gemm.spec.GemmTuning`'s
``backward`` / ``qkv_forward`` plans (imports Triton: loaded through :mod:`.lazy`)."""

from __future__ import annotations

import torch

from fuselab.core.checks import rows
from fuselab.ops.tuning import current
from fuselab.reference.bias_act import activation_grad
from fuselab.reference.gemm import unpack_bits

from .checks import GemmCall, LinearBackward, activation_id, tf32_enabled
from .launch import gemm_, pass_, pass_plan, plan, spec_of
from .spec import GemmOperands, GemmPlan, GemmTuning, PassSpec, RopeArgs, RopeSpec

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


def elementwise(a: torch.Tensor, out: torch.Tensor | None, *, s: torch.Tensor | None = None, pro: dict | None = None,
                g0: torch.Tensor | None = None, rope: tuple[RopeSpec, RopeArgs] | None = None, conj: bool = True,
                db: torch.Tensor | None = None, write: bool = True, dx0: torch.Tensor | None = None,
                copy: torch.Tensor | None = None, dx0_acc: bool = False, dx0_plus_a: bool = False) -> None:
    """One elementwise pass over ``a`` ``[M, N]``: the prologue (``pro``: :func:`prologue_flags` with the kept ``s``;
    the DCN multiplier ``g0``; the rotation ``rope``, inverse when ``conj``) into ``out`` (None: in place) where
    ``write``, its column sums into ``db``; ``a ⊙ s`` into ``dx0`` (``s`` the DCN's kept pre-product; plus ``a``
    where ``dx0_plus_a``, added to dx0 where ``dx0_acc``), ``a`` into ``copy``."""
    m, n = a.shape
    reach = max((r - 1) * abs(st) for t in (a, out, s, g0, dx0, copy) if t is not None
                for r, st in zip(t.shape, t.stride()))
    spec = PassSpec(m=m, n=n, dtype=a.dtype, device=a.device, **(pro or {}), pro_x0=g0 is not None,
                    rope=None if rope is None else rope[0], conj=conj, write=write, col_sum=db is not None,
                    int64=reach > 2**31 - 1, dx0=dx0 is not None, dx0_acc=dx0_acc, dx0_plus_a=dx0_plus_a,
                    copy=copy is not None)
    pass_(pass_plan(spec), a, out, s=s, g0=g0, db=db, rope=None if rope is None else rope[1], dx0=dx0, copy=copy)


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
    bias, dZ for the residual, lora_a, lora_b), empty tensors for the others, by the ``backward`` plan in force. dZ
    is asked only where it differs from dY (an activation): the outputs never alias the inputs or each other (a
    custom op's rule)."""
    bw = saved_for
    dtype = bw.dtype
    g = rows(grad if grad.dtype == dtype else grad.to(dtype))
    k = (bw.x if bw.x is not None else bw.weight).shape[-1]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if g.numel() == 0 or k == 0:
        return _empty_grads(g, k, bw.lora_a, acc, bw.want, _dz_torch(g, bw.saved, bw.keep, bw.activation))
    if current(GemmTuning).backward == "cublas":
        return _linear_backward_cublas(g, bw, acc)
    return _linear_backward_fused(g, bw, acc)


def _linear_backward_cublas(g: torch.Tensor, bw: LinearBackward, acc: torch.dtype) -> tuple:
    """dZ (and the bias gradient, its column sums) in one elementwise pass over dY, then cuBLAS: dX = dZ·W (+ U·A,
    U = s·dZ·B), dW = dZᵀ·x, dB = dZᵀ·T, dA = Uᵀ·x."""
    want_x, want_w, want_b, want_r, want_a, want_lb = bw.want
    m, n = g.shape
    pro = prologue_flags(bw.keep, bw.activation)
    db = g.new_empty(n, dtype=acc) if want_b else g.new_empty(0)
    if pro:
        dz = g.new_empty((m, n))
        elementwise(g, dz, s=bw.saved if bw.keep == "mask" else rows(bw.saved), pro=pro,
                    db=db if want_b else None)
    else:
        dz = g
        if want_b:
            db = g.sum(0, dtype=acc)
    u = None
    if bw.lora_a is not None and (want_x or want_a):
        u = torch.mm(dz, bw.lora_b).mul_(bw.lora_scale)
    dx = g.new_empty(0)
    if want_x:
        dx = torch.mm(dz, bw.weight)
        if u is not None:
            dx.addmm_(u, bw.lora_a)
    x2 = rows(bw.x) if bw.x is not None else None
    dw = torch.mm(dz.t(), x2) if want_w else g.new_empty(0)
    da = torch.mm(u.t(), x2) if want_a else g.new_empty(0)
    dlb = torch.mm(dz.t(), bw.t) if want_lb else g.new_empty(0)
    return dx, dw, db, dz if want_r else g.new_empty(0), da, dlb


def _linear_backward_fused(g: torch.Tensor, bw: LinearBackward, acc: torch.dtype) -> tuple:
    """Each gradient GEMM in the Triton kernel, dZ formed as dY is loaded (or written once beside dX where
    :attr:`~fuselab.ops.gemm.spec.GemmTuning.materialize_dz` or the residual asks for it)."""
    x, weight, saved, lora_a, lora_b, t = bw.x, bw.weight, bw.saved, bw.lora_a, bw.lora_b, bw.t
    keep, activation, lora_scale, want = bw.keep, bw.activation, bw.lora_scale, bw.want
    want_x, want_w, want_b, want_r, want_a, want_lb = want
    m, n = g.shape
    k = (x if x is not None else weight).shape[-1]
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
                weight_v: torch.Tensor | None, y: torch.Tensor, h: torch.Tensor | None,
                u: torch.Tensor | None = None) -> None:
    """y = x0 ⊙ (h Wᵀ + b) + xl with h = xl Vᵀ written first (low rank) or h = xl: one or two launches; the
    pre-product h Wᵀ + b kept in ``u`` [M, N] where given."""
    xl2 = rows(xl)
    if weight_v is not None:
        run(GemmOperands(a=xl2, b=weight_v.t(), c=h))
    run(GemmOperands(a=xl2 if h is None else h, b=weight.t(), c=y, bias=bias, x0=rows(x0), res=xl2, kept=u),
        bias=bias is not None, x0=True, residual=True, keep=3 if u is not None else 0)


def dcn_backward(grad, x0, xl, weight, bias, weight_v, h, u, want: list[bool]) -> tuple:
    """(dx0, dxl, dw, db [acc dtype], dv) of :func:`dcn_forward` (empty where not in ``want``): dx0 = g ⊙ u with u the
    kept pre-product h Wᵀ + b (or, without it, recomputed by the forward's epilogue with g as the multiplier);
    gx = g ⊙ x0; dW = gxᵀ·h with the bias gradient the column sums of gx; dxl = g + gx·W (full rank) or g + dT·V with
    dT = gx·W (low rank); dV = dTᵀ·xl. The ``backward`` plan ``"cublas"`` forms gx, the bias gradient, dx0 (from u)
    and the copy of g that dxl starts from in one elementwise pass and leaves the products to cuBLAS; ``"fused"``
    forms gx as the Triton kernel loads g."""
    want_x0, want_xl, want_w, want_b, want_v = want
    g = rows(grad)
    m, n = g.shape
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    x02, xl2 = rows(x0), rows(xl)
    out = [g.new_empty(0) for _ in range(5)]
    if want_x0:
        out[0] = g.new_empty((m, n))
    if want_b:
        out[3] = g.new_empty(n, dtype=acc)
    cublas = current(GemmTuning).backward == "cublas"
    if want_x0 and not (cublas and u is not None):
        run(GemmOperands(a=xl2 if h is None else h, b=weight.t(), c=out[0], bias=bias, x0=g), bias=bias is not None,
            x0=True)
    if cublas:
        _dcn_cublas(g, x02, xl2, weight, weight_v, h, u if want_x0 else None, want, out)
    elif want_xl or want_w or want_b or want_v:
        _dcn_fused(g, x02, xl2, weight, weight_v, h, want, out)
    return tuple(out)


def _dcn_cublas(g, x02, xl2, weight, weight_v, h, u, want, out) -> None:
    """One pass: gx = g ⊙ x0 and its column sums, dx0 = g ⊙ u (where ``u``), g copied into dxl; then dW, dT, dxl
    (an in-place addmm onto the copy) and dV by cuBLAS."""
    _, want_xl, want_w, want_b, want_v = want
    need_gx = want_xl or want_w or want_v
    if want_xl:
        out[1] = g.new_empty(g.shape)
    gx = g.new_empty(g.shape) if need_gx else None
    if need_gx or want_b or u is not None:
        target = gx if need_gx else out[0] if u is not None else None  # not written without gx: the strides only
        elementwise(g, target, s=u, g0=x02, db=out[3] if want_b else None, write=need_gx,
                    dx0=out[0] if u is not None else None, copy=out[1] if want_xl else None)
    if want_w:
        out[2] = g.new_empty(weight.shape)
    if want_v:
        out[4] = g.new_empty(weight_v.shape)
    _cross_products(gx, xl2, h, weight, weight_v, out[1] if want_xl else None, out[2] if want_w else None,
                    out[4] if want_v else None)


def _cross_products(gx, x, h, weight, weight_v, dxl, dw, dv) -> None:
    """A cross layer's products after its pass, each where its output is given: dw = gxᵀ·h (h = x at full rank);
    dxl += gx·W (full rank) or, with dT = gx·W, dxl += dT·V and dv = dTᵀ·x. dxl holds the pass's copy of g: the
    addmm runs in place on it."""
    if dw is not None:
        torch.mm(gx.t(), x if h is None else h, out=dw)
    if weight_v is None:
        if dxl is not None:
            torch.addmm(dxl, gx, weight, out=dxl)
        return
    if dxl is not None or dv is not None:
        dt = torch.mm(gx, weight)
        if dxl is not None:
            torch.addmm(dxl, dt, weight_v, out=dxl)
        if dv is not None:
            torch.mm(dt.t(), x, out=dv)


def _dcn_fused(g, x02, xl2, weight, weight_v, h, want, out) -> None:
    """The Triton kernel forms gx = g ⊙ x0 as it loads g, in the dT / dxl and dW launches."""
    _, want_xl, want_w, want_b, want_v = want
    m, n = g.shape
    hh = xl2 if h is None else h
    if weight_v is None and want_xl:
        out[1] = g.new_empty((m, n))
        run(GemmOperands(a=g, b=weight, c=out[1], g0=x02, res=g), pro_x0=True, residual=True)
    dt = None
    if weight_v is not None and (want_xl or want_v):
        dt = g.new_empty((m, weight.shape[1]))
        run(GemmOperands(a=g, b=weight, c=dt, g0=x02), pro_x0=True)
    if want_w:
        out[2] = g.new_empty(weight.shape)
        run(GemmOperands(a=g.t(), b=hh, c=out[2], g0=x02.t(), db=out[3] if want_b else None), pro_x0=True,
            n_along_p=True, row_sum=want_b)
    elif want_b:
        out[3] = (g.to(out[3].dtype) * x02.to(out[3].dtype)).sum(0)
    if dt is not None and want_xl:
        out[1] = g.new_empty((m, n))
        run(GemmOperands(a=dt, b=weight_v, c=out[1], res=g), residual=True)
    if dt is not None and want_v:
        out[4] = g.new_empty(weight_v.shape)
        run(GemmOperands(a=dt.t(), b=xl2, c=out[4]), n_along_p=True)


# ---------------------------------------------------------------------------------------------- QKV + RoPE
def qkv_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                rope: RopeSpec, args: RopeArgs) -> None:
    """out = rope(x Wᵀ + b) on the q and k columns of the fused projection (``out`` contiguous ``[M, N]``), by the
    ``qkv_forward`` plan: ``"fused"``, one launch with the rotation in the epilogue; ``"cublas"``, cuBLAS's
    projection (a bias of another dtype rounded to x's first), then q and k rotated in place in one pass."""
    if current(GemmTuning).qkv_forward == "fused":
        run(GemmOperands(a=x2, b=weight.t(), c=out, bias=bias, rope=args), bias=bias is not None, rope=rope)
        return
    if bias is None:
        torch.mm(x2, weight.t(), out=out)
    else:
        torch.addmm(bias.to(out.dtype), x2, weight.t(), out=out)
    elementwise(out[:, :rope.rot_cols], None, rope=(rope, args), conj=False)  # v's columns stay as they are


def qkv_backward(grad: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rope: RopeSpec, args: RopeArgs,
                 want: list[bool]) -> tuple:
    """(dx [M, K], dw, db [acc dtype]) with dZ = R⁻¹(dY), the inverse rotation of the q and k columns: dX = dZ·W,
    dW = dZᵀ·x, the bias gradient the column sums of dZ. The ``backward`` plan ``"cublas"`` forms dZ and the bias
    gradient in one elementwise pass and leaves dX and dW to cuBLAS; ``"fused"`` rotates dY back as the Triton
    kernel loads it (the bias gradient the row sums of the dW launch, taken through the MMA: each rotated element of dZ
    rounded to the dtype before it is summed, as a materialised half-precision dZ would be)."""
    want_x, want_w, want_b = want
    g = grad
    m, n = g.shape
    k = weight.shape[1]
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    db = g.new_empty(n, dtype=acc) if want_b else g.new_empty(0)
    if current(GemmTuning).backward == "cublas":
        dz = g.new_empty((m, n)) if want_x or want_w else None
        if dz is not None or want_b:
            elementwise(g, dz, rope=(rope, args), db=db if want_b else None, write=dz is not None)
        return (torch.mm(dz, weight) if want_x else g.new_empty(0), torch.mm(dz.t(), x2) if want_w else g.new_empty(0),
                db)
    dx, dw = g.new_empty((m, k)) if want_x else g.new_empty(0), g.new_empty((n, k)) if want_w else g.new_empty(0)
    if want_x:
        run(GemmOperands(a=g, b=weight, c=dx, rope=args), pro_rope=rope)
    if want_w or want_b:
        target = dw if want_w else g.new_empty((n, 1))  # the bias alone: row sums beside a one-column product
        b = x2 if want_w else x2[:, :1]
        run(GemmOperands(a=g.t(), b=b, c=target, db=db if want_b else None, rope=args), pro_rope=rope,
            n_along_p=True, row_sum=want_b)
    return dx, dw, db


# ---------------------------------------------------------------------------------------------- DCN cross network
def dcn_net_forward(x0: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, weight_v: torch.Tensor | None,
                    y: torch.Tensor, h: torch.Tensor | None, u: torch.Tensor, inter: torch.Tensor) -> None:
    """L cross layers on x0 [M, N] (weight [L, N, rank], bias [L, N], weight_v [L, rank, N] or None): layer l's
    output into inter[l] (y for the last), its h = x Vᵀ into h[l], its pre-product into u[l]."""
    x = x0
    for layer in range(weight.shape[0]):
        out = y if layer == weight.shape[0] - 1 else inter[layer]
        dcn_forward(x0, x, weight[layer], bias[layer], None if weight_v is None else weight_v[layer], out,
                    None if h is None else h[layer], u[layer])
        x = out


def dcn_net_backward(grad: torch.Tensor, x0: torch.Tensor, weight: torch.Tensor, weight_v: torch.Tensor | None,
                     h: torch.Tensor | None, u: torch.Tensor, inter: torch.Tensor) -> tuple:
    """(dx0, dw, db [L, N] acc dtype, dv) of :func:`dcn_net_forward`, the layers in reverse: per layer one pass forms
    gx = g ⊙ x0 with the bias gradient, adds g ⊙ u (and, for the first layer, whose input is x0, g itself) to dx0 and
    copies g into the buffer that becomes the next layer's g; cuBLAS computes dW = gxᵀ·h, dT = gx·W, that buffer
    (dx0 for the first layer) += dT·V, dV = dTᵀ·x."""
    layers, n = weight.shape[0], weight.shape[1]
    g = rows(grad)
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    dx0, gx = g.new_empty(g.shape), g.new_empty(g.shape)
    dw, dv = torch.empty_like(weight), None if weight_v is None else torch.empty_like(weight_v)
    db = g.new_empty((layers, n), dtype=acc)
    # the next layer's g, formed while the current one is read: two buffers alternate (one for two layers)
    buffers = [g.new_empty(g.shape) for _ in range(min(2, layers - 1))]
    for layer in reversed(range(layers)):
        x = x0 if layer == 0 else inter[layer - 1]
        nxt = dx0 if layer == 0 else buffers[layer % len(buffers)]
        elementwise(g, gx, s=u[layer], g0=x0, db=db[layer], dx0=dx0, dx0_acc=layer < layers - 1,
                    dx0_plus_a=layer == 0, copy=None if layer == 0 else nxt)
        _cross_products(gx, x, None if h is None else h[layer], weight[layer],
                        None if weight_v is None else weight_v[layer], nxt, dw[layer],
                        None if dv is None else dv[layer])
        g = nxt
    return dx0, dw, db, dv if dv is not None else g.new_empty(0)
