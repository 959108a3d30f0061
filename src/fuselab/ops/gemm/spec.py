"""The plain records of the GEMM family's launches (no Triton: the op modules build them before the launchers load):
tile configs and the tuning (:class:`GemmTuning`), what a launch's plan depends on (:class:`GemmSpec`, with the RoPE
geometry :class:`RopeSpec`), the plan itself (:class:`GemmPlan`) and one launch's tensors (:class:`GemmOperands`,
:class:`RopeArgs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fuselab.core.device import cdiv

#: the plans of :attr:`GemmTuning.backward` and :attr:`GemmTuning.qkv_forward`
PLAN_CHOICES: tuple[str, ...] = ("cublas", "fused")
#: bytes of shared memory a plan's pipelined A and B tiles and its epilogue/prologue layout conversions may take
#: (an H100/H200 SM gives a block 227 KiB)
SMEM_BUDGET = 200 * 1024


@dataclass(frozen=True)
class TileConfig:
    """One tile shape: ``[block_p, block_q]`` output tiles, ``block_r`` reduction steps, ``warps`` per program,
    ``stages`` of software pipelining, ``group`` row tiles walked together (L2 reuse)."""

    block_p: int = 128
    block_q: int = 128
    block_r: int = 64
    warps: int = 8
    stages: int = 3
    group: int = 8


@dataclass(frozen=True, eq=False)
class GemmTuning:
    """The planner's knobs (:func:`fuselab.ops.tuning.override` changes them for a sweep). Tile configs are picked
    by the shape rules of :func:`fuselab.ops.gemm.launch.choose_tile` (``benchmarks/notes/gemm.md``): ``wide`` for
    large outputs with at least ``wide_min_q`` columns and ``wide_min_p`` rows, TMA operands, no prologue and a plain
    epilogue, ``narrow`` for at most ``narrow_max_q`` columns,
    ``weight_grad`` for the reductions over tokens (weight and bias gradients), ``fp32`` for exact fp32, else
    ``large``; ``force`` overrides them all. Reductions over tokens split into up to ``max_split`` parts (each at
    least ``min_split_steps`` steps) when the output has fewer tiles than the grid has programs
    (``programs_per_sm`` per SM). ``tma``: read A and B through host TMA descriptors where Hopper, alignment and
    layout allow. ``flatten`` / ``warp_specialize``: Triton's options of the persistent loop.
    ``materialize_dz``: the backward writes dZ once in the operand dtype (while computing dX) and the weight
    gradients read it, instead of applying act' again as they load dY.
    ``backward``: ``"cublas"`` forms dZ (and the bias gradient) in one elementwise pass over dY and leaves dX and dW
    to cuBLAS; ``"fused"`` computes each gradient GEMM in the Triton kernel with dZ formed as dY is loaded.
    ``qkv_forward``: ``"cublas"`` projects with cuBLAS and rotates q and k in place in one elementwise pass;
    ``"fused"`` rotates them in the GEMM's epilogue. The defaults and the measurements behind them:
    ``benchmarks/notes/gemm.md``, section "Rules". Raises ValueError for another ``backward`` / ``qkv_forward``."""

    large: TileConfig = TileConfig(128, 128, 64, 8, 3)
    wide: TileConfig = TileConfig(128, 256, 64, 8, 3)
    narrow: TileConfig = TileConfig(128, 64, 64, 4, 4)
    weight_grad: TileConfig = TileConfig(128, 64, 64, 8, 4)
    fp32: TileConfig = TileConfig(64, 64, 32, 4, 3)
    wide_min_q: int = 256
    wide_min_p: int = 8192
    narrow_max_q: int = 64
    programs_per_sm: int = 1
    max_split: int = 16
    min_split_steps: int = 8
    tma: bool = True
    flatten: bool = False
    warp_specialize: bool = False
    materialize_dz: bool = False
    backward: str = "cublas"
    qkv_forward: str = "cublas"
    force: TileConfig | None = None

    def __post_init__(self) -> None:
        for name in ("backward", "qkv_forward"):
            if getattr(self, name) not in PLAN_CHOICES:
                raise ValueError(f"GemmTuning.{name} must be one of {', '.join(PLAN_CHOICES)}, "
                                 f"got {getattr(self, name)!r}")


@dataclass(frozen=True)
class RopeSpec:
    """What a RoPE epilogue (or the inverse rotation of a prologue) is compiled for: pairs (i, i + pair_stride)
    inside groups of 2·pair_stride columns (neox: pair_stride = half; interleaved: 1), ``half`` rotated pairs per
    head of ``head_dim`` columns, columns below ``rot_cols`` (q and k) rotated, a cos/sin table or in-kernel
    angles, and how a token finds its position (``pos_mode``, see ``kernels._positions``)."""

    pair_stride: int
    half: int
    head_dim: int
    rot_cols: int
    use_table: bool
    pos_mode: int = 0
    search_steps: int = 1


@dataclass(frozen=True)
class GemmSpec:
    """Everything a launch's plan depends on (no tensors, hashable): sizes (``p`` x ``r`` times ``r`` x ``q``), the
    operands' dtype, the device and the flags. ``act`` / ``pro_act``: activation ids (the index
    in :data:`fuselab.reference.bias_act.ACTIVATIONS`); ``keep`` 0 nothing, 1 the pre-activation, 2 ReLU bits, 3
    the DCN's pre-product acc + bias;
    ``a_tma`` / ``b_tma``: 0 pointers, 1 a descriptor of the operand, 2 of its transpose (see :func:`tma_mode`)."""

    p: int
    q: int
    r: int
    dtype: torch.dtype
    device: torch.device
    tf32: bool = False
    act: int = 0
    bias: bool = False
    x0: bool = False
    residual: bool = False
    keep: int = 0
    rope: RopeSpec | None = None
    lora_rank: int = 0
    pro_act: int = 0
    pro_mask: bool = False
    pro_x0: bool = False
    pro_rope: RopeSpec | None = None
    n_along_p: bool = False
    row_sum: bool = False
    write_a: bool = False
    int64: bool = False
    a_tma: int = 0
    b_tma: int = 0


@dataclass(frozen=True)
class GemmPlan:
    """A launch: the spec, its tile config, the split of the reduction, the grid and the constexprs (a tuple of
    (name, value) pairs: hashable, the launch cache's key)."""

    spec: GemmSpec
    tile: TileConfig
    split: int
    k_per_split: int
    grid: tuple[int]
    constexprs: tuple[tuple[str, Any], ...]

    @property
    def n_tiles(self) -> int:
        return cdiv(self.spec.p, self.tile.block_p) * cdiv(self.spec.q, self.tile.block_q)


@dataclass(frozen=True)
class PassSpec:
    """What a launch of the elementwise pass (:mod:`fuselab.ops.gemm.pass_kernel`) is planned from: the ``[m, n]``
    operand's sizes, dtype and device, its prologue (act' id ``pro_act``, ReLU bits, DCN multiplier, a RoPE
    rotation, inverse when ``conj``), whether the result is written and its column sums reduced, 64-bit offsets;
    the DCN backward's side outputs: ``dx0`` the operand times the kept pre-product (plus the operand where
    ``dx0_plus_a``, added to what dx0 holds where ``dx0_acc``), ``copy`` the operand as read."""

    m: int
    n: int
    dtype: torch.dtype
    device: torch.device
    pro_act: int = 0
    pro_mask: bool = False
    pro_x0: bool = False
    rope: RopeSpec | None = None
    conj: bool = True
    write: bool = True
    col_sum: bool = False
    int64: bool = False
    dx0: bool = False
    dx0_acc: bool = False
    dx0_plus_a: bool = False
    copy: bool = False


@dataclass(frozen=True)
class PassPlan:
    """A launch of the elementwise pass: ``programs`` along M (``rows_per_program`` rows each, ``[block_m, block_n]``
    tiles) times the column blocks, and the constexprs (hashable (name, value) pairs: the launch cache's key)."""

    spec: PassSpec
    rows_per_program: int
    grid: tuple[int, int]
    constexprs: tuple[tuple[str, Any], ...]


@dataclass
class RopeArgs:
    """The per-launch values of a RoPE epilogue/prologue: tables (or ``freq``), positions/offsets/cu_seqlens and
    how a row index m splits into (batch b, index s) = ((m // div_b) % mod_b, (m // div_s) % mod_s)."""

    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    freq: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [B or 1, S] (thd: [1, T])
    offsets: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    offset: int = 0
    mscale: float = 1.0
    div_b: int = 1
    mod_b: int = 1
    div_s: int = 1
    mod_s: int = 1


@dataclass
class GemmOperands:
    """The tensors of one launch, as views of the logical shapes the kernel's comments give (``a`` [P, R], ``b``
    [R, Q], ``c`` [P, Q], ``s``/``g0`` [P, R], ``x0``/``res`` [P, Q], ``l1`` [R, rank], ``l2`` [rank, Q]); ``kept``,
    ``t``, ``aout``, ``db`` contiguous. ``s`` holds ReLU bits ([token rows, cdiv(n, 8)] uint8) for a mask prologue."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    bias: torch.Tensor | None = None
    x0: torch.Tensor | None = None
    res: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    l1: torch.Tensor | None = None
    l2: torch.Tensor | None = None
    t: torch.Tensor | None = None
    s: torch.Tensor | None = None
    g0: torch.Tensor | None = None
    aout: torch.Tensor | None = None
    db: torch.Tensor | None = None
    alpha: float = 1.0
    lora_scale: float = 1.0
    rope: RopeArgs | None = field(default=None)


@dataclass(frozen=True)
class CastStep:
    """The update :func:`fuselab.ops.gemm.cast_update_` applies: the optimizer ("sgd" or "adagrad"), the learning
    rate (used when no device tensor gives it), Adagrad's eps and the weight decay."""

    optimizer: str
    lr: float
    eps: float
    weight_decay: float
