"""Benchmark suite: GEMMs with their epilogues (``fuselab.gemm``, ``dcn_cross``, ``qkv_rope``; ``docs/gemm.md``).

Kinds of case (``params["kind"]``; every provider takes the kind as its first argument):

* ``linear``: ``act(x Wᵀ + b)`` at the DLRM's MLP shapes (M 65536; (K, N) from 13 to 3456, 367/368 and N = 1
  included, relu) and LLM shapes (4096-8192 square, no activation or gelu_tanh);
* ``lora``: ``x Wᵀ + b + s·(x Aᵀ) Bᵀ`` (rank 16) at an LLM shape;
* ``qkv``: the fused QKV projection with RoPE on q and k (GQA: 32 q heads, 8 kv heads of 128);
* ``dcn``: the MLPerf DCNv2 low-rank cross layer ``x0 ⊙ ((xl Vᵀ) Wᵀ + b) + xl`` (M 65536, N 3456, rank 512).

Providers: ``cublas`` (``F.linear`` / ``torch.matmul`` and the epilogue as separate ops, as a model is written: the
baseline), ``cublaslt`` (``torch._addmm_activation``: cuBLASLt's bias + relu/gelu epilogue; linear only),
``torch.compile`` (default) and ``max-autotune`` of the cuBLAS code, ``fuselab``.

Cost model: flops ``2·M·N·K`` forward (LoRA: ``+ 2·M·r·(K + N)``; DCN: ``2·M·r·2N``), three times that for fwd+bwd
(dX and dW). Bytes: each operand read once and each output written once: forward ``s·(M·K + N·K + M·N) + N·s``;
the backward adds ``dY`` and ``x`` read, ``dX``, ``dW``, ``db`` written. TFLOP/s is the figure that matters here; a
case's fraction of the run's bf16 matmul rate is its TFLOP/s over the ``matmul rate`` line of the report (the
ceilings in the JSON file).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider
from fuselab.core.compile import compile_quietly
from fuselab.reference import gemm as ref

GPU_ROWS = 65536
#: (K, N) of the DLRM MLPs: Kaggle bottom 13-512-256-64-16, top 367-512-256-1 (367 and its 16-byte aligned 368),
#: MLPerf DCNv2 bottom 13-512-256-128 and top 3456-1024-1024-512-256-1, MLPerf DLRM top input 479
DLRM_SHAPES: tuple[tuple[int, int], ...] = ((13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (368, 512),
                                            (479, 1024), (1024, 1024), (1024, 512), (256, 1), (3456, 1024))
DLRM_QUICK: tuple[tuple[int, int], ...] = ((512, 256), (367, 512))
#: (M, K, N, activation) of LLM-sized linear layers
LLM_SHAPES: tuple[tuple[int, int, int, str], ...] = ((4096, 4096, 4096, "none"), (8192, 8192, 8192, "none"),
                                                     (8192, 4096, 4096, "gelu_tanh"))
QKV = dict(tokens=8192, seq=2048, hidden=4096, heads=32, kv_heads=8, head_dim=128)
LORA = dict(m=8192, k=4096, n=4096, rank=16)
DCN = dict(m=GPU_ROWS, n=3456, rank=512)
CPU_ROWS = 64
#: (M, K, N, activation) on CPU (the Triton interpreter checks fuselab): tiny, odd K, N = 1
CPU_LINEAR: tuple[tuple[int, int, int, str], ...] = ((CPU_ROWS, 13, 48, "relu"), (CPU_ROWS, 37, 1, "relu"),
                                                     (CPU_ROWS, 96, 80, "gelu_tanh"))
DEFAULT_DTYPES = (torch.bfloat16,)
DEFAULT_MODES = ("fwd", "fwd+bwd")


def _case(label: str, dtype: torch.dtype, mode: str, flops: int, nbytes: int, numel: int, **params) -> BenchCase:
    scale = {"fwd": 1, "bwd": 2, "fwd+bwd": 3}[mode]
    return BenchCase(op="gemm", label=label, dtype=dtype, mode=mode, bytes=nbytes * (1 if mode == "fwd" else 2),
                     flops=flops * scale, numel=numel, params=params)


def _linear_cases(dtype: torch.dtype, mode: str, gpu: bool, quick: bool) -> list[BenchCase]:
    s = dtype.itemsize
    if gpu:
        dlrm = [(GPU_ROWS, k, n, "relu") for k, n in (DLRM_QUICK if quick else DLRM_SHAPES)]
        shapes = (*dlrm, *(LLM_SHAPES[:1] if quick else LLM_SHAPES))
    else:
        shapes = CPU_LINEAR[:1] if quick else CPU_LINEAR
    return [_case(f"{m}x{k}x{n}-{act}", dtype, mode, 2 * m * n * k, s * (m * k + n * k + m * n + n), m * n,
                  kind="linear", m=m, k=k, n=n, activation=act) for m, k, n, act in shapes]


def cases(query: CaseQuery) -> list[BenchCase]:
    gpu = query.device_type == "cuda"
    out = []
    for dtype, mode in query.combinations(DEFAULT_DTYPES, DEFAULT_MODES):
        out += _linear_cases(dtype, mode, gpu, query.quick)
        if query.quick:
            continue
        s = dtype.itemsize
        lo = LORA if gpu else dict(m=CPU_ROWS, k=48, n=40, rank=4)
        m, k, n, r = lo["m"], lo["k"], lo["n"], lo["rank"]
        out.append(_case(f"lora-{m}x{k}x{n}-r{r}", dtype, mode, 2 * m * n * k + 2 * m * r * (k + n),
                         s * (m * k + n * k + m * n + r * (k + n)), m * n, kind="lora", m=m, k=k, n=n, rank=r))
        q = QKV if gpu else dict(tokens=32, seq=16, hidden=64, heads=4, kv_heads=2, head_dim=16)
        nq = (q["heads"] + 2 * q["kv_heads"]) * q["head_dim"]
        t, h = q["tokens"], q["hidden"]
        out.append(_case(f"qkv-{t}x{h}-{q['heads']}/{q['kv_heads']}x{q['head_dim']}", dtype, mode, 2 * t * nq * h,
                         s * (t * h + nq * h + t * nq), t * nq, kind="qkv", **q))
        d = DCN if gpu else dict(m=CPU_ROWS, n=48, rank=8)
        m, n, r = d["m"], d["n"], d["rank"]
        out.append(_case(f"dcn-{m}x{n}-r{r}", dtype, mode, 4 * m * n * r, s * (4 * m * n + 2 * n * r), m * n,
                         kind="dcn", m=m, n=n, rank=r))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple:
    """(kind, tensors..., options): normal inputs, weights scaled by 1/sqrt(fan-in) (nn.Linear's scale)."""
    p, dt = case.params, case.dtype

    def randn(*shape, fan=1):
        return (torch.randn(*shape, device=device) / math.sqrt(fan)).to(dt)

    kind = p["kind"]
    if kind == "linear":
        return kind, randn(p["m"], p["k"]), randn(p["n"], p["k"], fan=p["k"]), randn(p["n"]), p["activation"]
    if kind == "lora":
        return (kind, randn(p["m"], p["k"]), randn(p["n"], p["k"], fan=p["k"]), randn(p["n"]),
                randn(p["rank"], p["k"], fan=p["k"]), randn(p["n"], p["rank"], fan=p["rank"]), 2.0)
    if kind == "qkv":
        nq = (p["heads"] + 2 * p["kv_heads"]) * p["head_dim"]
        angles = torch.arange(p["seq"], device=device, dtype=torch.float64)[:, None] / (
            10000.0 ** (torch.arange(0, p["head_dim"], 2, device=device, dtype=torch.float64) / p["head_dim"]))
        return (kind, randn(p["tokens"] // p["seq"], p["seq"], p["hidden"]), randn(nq, p["hidden"], fan=p["hidden"]),
                angles.cos().float(), angles.sin().float(), p["heads"], p["kv_heads"])
    return (kind, randn(p["m"], p["n"]), randn(p["m"], p["n"]), randn(p["n"], p["rank"], fan=p["rank"]),
            randn(p["n"]), randn(p["rank"], p["n"], fan=p["n"]))


def grad_args(case: BenchCase) -> tuple[int, ...]:
    return {"linear": (1, 2, 3), "lora": (1, 4, 5), "qkv": (1, 2), "dcn": (1, 2, 3, 4, 5)}[case.params["kind"]]


# ---------------------------------------------------------------------------------------------- providers
def _act(z: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    return F.gelu(z, approximate="tanh") if activation == "gelu_tanh" else z


def _split_heads(qkv: torch.Tensor, heads: int, kv_heads: int) -> tuple:
    head_dim = qkv.shape[-1] // (heads + 2 * kv_heads)
    return qkv.view(*qkv.shape[:-1], heads + 2 * kv_heads, head_dim).split((heads, kv_heads, kv_heads), dim=-2)


def cublas(kind, *args):
    """The layer as a model writes it: F.linear (cuBLAS, bias in its addmm) and the epilogue as separate ops; the QKV
    projection followed by fuselab.apply_rope (the project's own RoPE pass)."""
    if kind == "linear":
        x, w, b, activation = args
        return _act(F.linear(x, w, b), activation)
    if kind == "lora":
        x, w, b, a, bb, scale = args
        return F.linear(x, w, b) + scale * F.linear(F.linear(x, a), bb)
    if kind == "qkv":
        from fuselab.ops.rope import apply_rope

        x, w, cos, sin, heads, kv_heads = args
        q, k, v = _split_heads(F.linear(x, w), heads, kv_heads)
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v
    x0, xl, w, b, v = args
    return x0 * F.linear(F.linear(xl, v), w, b) + xl


class _AddmmRelu(torch.autograd.Function):
    """cuBLASLt's bias + relu epilogue forward; the backward in eager ops (the mask from y, two matmuls, a column
    sum): what a model on ``torch._addmm_activation`` runs, as torch has no derivative for it."""

    @staticmethod
    def forward(ctx, x, w, b):
        y = torch._addmm_activation(b, x, w.t())
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        dz = g * (y > 0)
        return dz @ w, dz.t() @ x, dz.sum(0)


def cublaslt(kind, x, w, b, activation):
    """cuBLASLt's fused epilogue through torch: bias + relu or gelu (tanh) in the GEMM (addmm for no activation)."""
    if activation == "none":
        return torch.addmm(b, x, w.t())
    if activation == "relu":
        return _AddmmRelu.apply(x, w, b)
    return torch._addmm_activation(b, x, w.t(), use_gelu=True)


def fuselab_gemm(kind, *args):
    from fuselab.ops.gemm import LoRA, dcn_cross, gemm, qkv_rope

    if kind == "linear":
        x, w, b, activation = args
        return gemm(x, w, b, activation=activation, keep="mask" if activation == "relu" else "auto")
    if kind == "lora":
        x, w, b, a, bb, scale = args
        return gemm(x, w, b, lora=LoRA(a, bb, scale))
    if kind == "qkv":
        x, w, cos, sin, heads, kv_heads = args
        return qkv_rope(x, w, num_heads=heads, num_kv_heads=kv_heads, cos=cos, sin=sin)
    x0, xl, w, b, v = args
    return dcn_cross(x0, xl, w, b, weight_v=v)


def reference(kind, *args):
    """float64 on the harness's copies: the reference module of each kind."""
    if kind == "linear":
        x, w, b, activation = args
        return ref.linear(x, w, b, activation=activation)
    if kind == "lora":
        x, w, b, a, bb, scale = args
        return ref.linear(x, w, b, lora=ref.LoRA(a, bb, scale))
    if kind == "qkv":
        x, w, cos, sin, heads, kv_heads = args
        return ref.qkv_rope(x, w, None, heads, kv_heads, dict(cos=cos, sin=sin))
    x0, xl, w, b, v = args
    return ref.dcn_cross(x0, xl, w, b, v)


def _compiled(mode: str | None):
    def build(case: BenchCase):
        torch._dynamo.reset()  # a fresh cache per case: many shapes of one function hit the recompile limit
        return compile_quietly(cublas, dynamic=False, **({"mode": mode} if mode else {}))

    return build


def _lt_supports(case: BenchCase) -> str | None:
    if case.params["kind"] != "linear":
        return "cuBLASLt's epilogues are bias + relu/gelu only"
    if case.mode != "fwd" and case.params["activation"] == "gelu_tanh":
        return "cuBLASLt's gelu epilogue keeps no pre-activation for a backward"
    return None


SPEC = OpSpec(
    name="gemm",
    summary="GEMM + epilogue: cuBLAS + separate ops vs cuBLASLt epilogue vs torch.compile (default, max-autotune) "
            "vs fuselab",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        Provider(name="cublas", build=lambda case: cublas,
                 description="F.linear (cuBLAS) + the epilogue as separate ops; QKV: + fuselab.apply_rope"),
        Provider(name="cublaslt", build=lambda case: cublaslt, supports=_lt_supports,
                 description="torch._addmm_activation: cuBLASLt's bias + relu/gelu epilogue"),
        Provider(name="torch.compile", build=_compiled(None), description="torch.compile of the cublas code"),
        Provider(name="max-autotune", build=_compiled("max-autotune"), cuda_only=True,
                 description='torch.compile(mode="max-autotune") of the cublas code (Triton GEMM templates)'),
        Provider(name="fuselab", build=lambda case: fuselab_gemm, triton=True,
                 description="fuselab.gemm / qkv_rope / dcn_cross: the epilogue in the GEMM (relu: 1-bit mask)"),
    ),
    grad_args=grad_args,
    baseline="cublas",
)
