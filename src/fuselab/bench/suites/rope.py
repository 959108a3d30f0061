"""Benchmark suite: rotary position embedding on q and k together (bf16, GQA), forward and forward+backward.

Arguments of every provider (and of the float64 reference):
``(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen)`` with q/k in ``layout`` (bshd or thd),
cos/sin fp32 ``(seqlen_ro, head_dim // 2)`` tables, ``seqlen_offsets`` an int or a (batch,) tensor.

Cost model (minimum traffic, each tensor once): fwd reads q and k and writes q_out and k_out, plus
the cos and sin rows the case needs, read once (fp32, ``rows × head_dim/2 × 4 B`` each; rows =
distinct positions: seq for bshd, the longest sequence for thd, batch for decode). bwd moves the same
(read grads of the outputs, write grads of q and k, tables again); fwd+bwd is twice fwd.

Peers get their inputs in their own format, prepared *outside* the timed call and memoized per
input set (what a model does once per step for all layers): HF-style duplicated per-token tables
for eager/torch.compile/Liger, bf16 tables for flash-attn (it requires table dtype == input dtype),
angle tables for Transformer Engine. Liger takes q/k as (batch, heads, seq, head_dim): it gets a
transposed view of the bshd tensors (no copy) and rotates in place, so it is marked ``inplace``.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

import fuselab
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider
from fuselab.core.compile import compile_quietly
from fuselab.reference import rope as ref

DEFAULT_DTYPES = (torch.bfloat16,)
CPU_DTYPES = (torch.float32,)
DEFAULT_MODES = ("fwd", "fwd+bwd")
TABLE_BYTES = 4  # fp32 tables

# (label, kind, batch, seq, q heads, kv heads, head_dim); thd: batch = sequences, seq = total tokens
GPU_SHAPES = (
    ("8x4096x32/8x128", "bshd", 8, 4096, 32, 8, 128),
    ("4x4096x32/32x128", "bshd", 4, 4096, 32, 32, 128),
    ("1x16384x64/8x128", "bshd", 1, 16384, 64, 8, 128),
    ("16x2048x16/16x64", "bshd", 16, 2048, 16, 16, 64),
    ("thd64x65536x32/8x128", "thd", 64, 65536, 32, 8, 128),
    ("decode64x1x32/8x128", "decode", 64, 1, 32, 8, 128),
)
CPU_SHAPES = (
    ("2x16x4/2x32", "bshd", 2, 16, 4, 2, 32),
    ("thd4x40x4/2x32", "thd", 4, 40, 4, 2, 32),
    ("decode4x1x4/2x32", "decode", 4, 1, 4, 2, 32),
)
DECODE_TABLE_ROWS = {"cuda": 4096, "cpu": 64}


def seq_lengths(n_seqs: int, total: int) -> list[int]:
    """Deterministic uneven lengths (ratio up to ~7x) summing to ``total``."""
    g = torch.Generator().manual_seed(n_seqs * 7919 + total)
    w = 0.25 + 1.5 * torch.rand(n_seqs, generator=g, dtype=torch.float64, device="cpu")
    lengths = [max(1, int(x)) for x in (w / w.sum() * total).tolist()]
    lengths[-1] += total - sum(lengths)
    return lengths


def _table_rows(kind: str, b: int, s: int, device_type: str) -> int:
    if kind == "thd":
        return max(seq_lengths(b, s))
    return b if kind == "decode" else s


def cases(query: CaseQuery) -> list[BenchCase]:
    shapes = GPU_SHAPES if query.device_type == "cuda" else CPU_SHAPES
    if query.quick:
        shapes = shapes[:1] + shapes[-1:]
    out = []
    dtypes = DEFAULT_DTYPES if query.device_type == "cuda" else CPU_DTYPES
    for dtype, mode in query.combinations(dtypes, DEFAULT_MODES):
        for label, kind, b, s, hq, hk, d in shapes:
            tokens = s if kind == "thd" else b * s
            elems = tokens * (hq + hk) * d
            table = 2 * _table_rows(kind, b, s, query.device_type) * (d // 2) * TABLE_BYTES
            one_way = 2 * elems * dtype.itemsize + table  # read q, k + write outputs + cos/sin rows
            nbytes = one_way * (2 if mode == "fwd+bwd" else 1)
            read = (elems * dtype.itemsize + table) * (2 if mode == "fwd+bwd" else 1)
            flops = 3 * elems * (2 if mode == "fwd+bwd" else 1)
            params = {"kind": kind, "batch": b, "seq": s, "hq": hq, "hk": hk, "head_dim": d,
                      "table_rows": DECODE_TABLE_ROWS[query.device_type] if kind == "decode" else None}
            out.append(BenchCase(op="rope", label=label, dtype=dtype, mode=mode, bytes=nbytes, flops=flops,
                                 numel=elems, params=params, l2_cold=kind == "decode",
                                 read_bytes=read))
    return out


@functools.lru_cache(maxsize=16)
def _tables(rows: int, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return fuselab.rope_cos_sin(rows, dim, device=device)


def make_inputs(case: BenchCase, device: torch.device) -> tuple[Any, ...]:
    """Fresh random q, k (normal); fp32 tables; offsets/cu_seqlens as the case needs."""
    p = case.params
    kind, b, s, hq, hk, d = p["kind"], p["batch"], p["seq"], p["hq"], p["hk"], p["head_dim"]
    if kind == "thd":
        lengths = seq_lengths(b, s)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        q = torch.randn(s, hq, d, device=device, dtype=case.dtype)
        k = torch.randn(s, hk, d, device=device, dtype=case.dtype)
        cos, sin = _tables(max(lengths), d, device)
        return q, k, cos, sin, "thd", 0, cu, max(lengths)
    q = torch.randn(b, s, hq, d, device=device, dtype=case.dtype)
    k = torch.randn(b, s, hk, d, device=device, dtype=case.dtype)
    if kind == "decode":
        rows = p["table_rows"]
        cos, sin = _tables(rows, d, device)
        offsets = torch.randint(0, rows - s + 1, (b,), device=device, dtype=torch.int32)
        return q, k, cos, sin, "bshd", offsets, None, None
    cos, sin = _tables(s, d, device)
    return q, k, cos, sin, "bshd", 0, None, None


def reference(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
    return ref.apply_rope(q, k, cos, sin, layout=layout, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens)


def grad_args(case: BenchCase) -> tuple[int, ...]:
    return (0, 1)


# ---------------------------------------------------------------------------------------------- fuselab
def _fuselab(inplace: bool = False, angles: bool = False) -> Callable:
    def fn(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
        if angles:
            cos = sin = None
        return fuselab.apply_rope(q, k, cos, sin, layout=layout, seqlen_offsets=seqlen_offsets,
                                  cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, inplace=inplace)
    return fn


# ---------------------------------------------------------------------------------------------- peers' inputs
class _Memo:
    """Per-input-set preparation, done once outside the timed calls (keyed on the argument objects)."""

    def __init__(self, prepare: Callable[..., Any]):
        self.prepare, self.cache = prepare, {}

    def __call__(self, *objs: Any) -> Any:
        key = tuple(id(o) for o in objs)
        hit = self.cache.get(key)
        if hit is not None and all(r() is o for r, o in zip(hit[0], objs) if r is not None):
            return hit[1]
        value = self.prepare(*objs)
        if len(self.cache) > 256:
            self.cache.clear()
        refs = tuple(weakref.ref(o) if isinstance(o, torch.Tensor) else None for o in objs)
        self.cache[key] = (refs, value)
        return value


def _positions(q, layout, seqlen_offsets, cu_seqlens) -> torch.Tensor:
    """(batch, seq) table rows of every token (thd: (1, total_tokens))."""
    view = ref.to_bshd(q, layout)
    return ref.token_positions(view.shape[0], view.shape[1], q.device, layout=layout,
                               seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens)


def _hf_tables(q, cos, sin, layout, seqlen_offsets, cu_seqlens):
    """HF's per-token duplicated tables (batch, seq, head_dim) in q's dtype, as HF's rotary module returns."""
    pos = _positions(q, layout, seqlen_offsets, cu_seqlens)
    return (torch.cat((cos, cos), -1)[pos].to(q.dtype), torch.cat((sin, sin), -1)[pos].to(q.dtype))


_hf_memo = _Memo(_hf_tables)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_formula(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """Hugging Face's eager formula on (batch, seq, heads, head_dim) with (batch, seq, head_dim) tables."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _hf_provider(formula: Callable) -> Callable:
    def fn(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
        c, s = _hf_memo(q, cos, sin, layout, seqlen_offsets, cu_seqlens)
        if layout == "thd":
            qo, ko = formula(q.unsqueeze(0), k.unsqueeze(0), c, s)
            return qo.squeeze(0), ko.squeeze(0)
        return formula(q, k, c, s)
    return fn


def _build_compiled(case: BenchCase) -> Callable:
    torch._dynamo.reset()  # a fresh cache per case: no recompile-limit fallbacks
    return _hf_provider(compile_quietly(hf_formula, dynamic=False))


def _bshd_only(case: BenchCase) -> str | None:
    return "no packed (thd) layout" if case.params["kind"] == "thd" else None


def _build_liger(case: BenchCase) -> Callable:
    from liger_kernel.ops.rope import LigerRopeFunction

    def fn(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
        c, s = _hf_memo(q, cos, sin, layout, seqlen_offsets, cu_seqlens)
        qo, ko = LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), c, s)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    return fn


_cast_memo = _Memo(lambda cos, sin, dtype: (cos.to(dtype), sin.to(dtype)))


def _build_flash_attn(case: BenchCase) -> Callable:
    from flash_attn.layers.rotary import apply_rotary_emb

    def fn(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
        c, s = _cast_memo(cos, sin, q.dtype)
        kw = dict(seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        return apply_rotary_emb(q, c, s, **kw), apply_rotary_emb(k, c, s, **kw)
    return fn


def _te_rope():
    try:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
    except ImportError:
        from transformer_engine.pytorch.attention import apply_rotary_pos_emb
    return apply_rotary_pos_emb


_angles_memo = _Memo(lambda cos, sin: torch.cat([torch.atan2(sin, cos)] * 2, -1)[:, None, None, :].float())


def _build_te(case: BenchCase) -> Callable:
    rope = _te_rope()
    has_start = "start_positions" in inspect.signature(rope).parameters

    def fn(q, k, cos, sin, layout, seqlen_offsets, cu_seqlens, max_seqlen):
        freqs = _angles_memo(cos, sin)
        kw: dict[str, Any] = {"tensor_format": layout, "fused": True}
        if cu_seqlens is not None:
            kw["cu_seqlens"] = cu_seqlens
        if isinstance(seqlen_offsets, torch.Tensor):
            if not has_start:
                raise RuntimeError("this Transformer Engine has no start_positions (per-batch offsets)")
            kw["start_positions"] = seqlen_offsets
        return rope(q, freqs, **kw), rope(k, freqs, **kw)
    return fn


SPEC = OpSpec(
    name="rope",
    summary="rotary position embedding on q and k (GQA, bf16): fwd and fwd+bwd, bshd, thd and decode",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        Provider(name="eager", build=lambda case: _hf_provider(hf_formula),
                 description="Hugging Face's formula in eager PyTorch (per-token tables prepared once per input set)"),
        Provider(name="torch.compile", build=_build_compiled, description="torch.compile (Inductor) of HF's formula"),
        Provider(name="liger", build=_build_liger, requires=("liger_kernel",), cuda_only=True, inplace=True,
                 supports=_bshd_only, description="Liger-Kernel LigerRopeFunction (HF-style tables, in place)"),
        Provider(name="flash-attn", build=_build_flash_attn, requires=("flash_attn",), cuda_only=True,
                 description="flash-attn's Triton apply_rotary_emb, one call for q and one for k (bf16 tables)"),
        Provider(name="transformer-engine", build=_build_te, requires=("transformer_engine",), cuda_only=True,
                 description="Transformer Engine apply_rotary_pos_emb(fused=True), q and k separately"),
        Provider(name="fuselab", build=lambda case: _fuselab(), triton=True,
                 description="fuselab.apply_rope: q and k in one launch, fp32 tables"),
        Provider(name="fuselab-inplace", build=lambda case: _fuselab(inplace=True), triton=True, inplace=True,
                 modes=("fwd",), description="fuselab.apply_rope(inplace=True): writes into q and k"),
        Provider(name="fuselab-angles", build=lambda case: _fuselab(angles=True), triton=True,
                 description="fuselab.apply_rope with in-kernel angles (no cos/sin table read)"),
    ),
    grad_args=grad_args,
    baseline="eager",
)
