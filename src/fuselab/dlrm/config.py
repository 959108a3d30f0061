"""DLRM configuration: one dataclass, built-in presets (JSON files), JSON/TOML loading, overrides.

Presets (``src/fuselab/dlrm/configs/*.json``):

* ``kaggle``: D=16, bottom 13-512-256-64-16, top 512-256-1 (facebookresearch/dlrm's Kaggle run), batch 65536,
  row-wise Adagrad; learning rates for every optimizer in ``learning_rates`` (the MLPs' Adagrad at 5e-4: at 0.01
  the loss rose to 1.5x the untrained model's, ``benchmarks/notes/dlrm.md``). Schedule after NVIDIA's and MLPerf's
  recipe, scaled to one epoch of the Kaggle train split (599 steps of 65536): linear warm-up over 10 steps,
  constant, then quadratic decay from step 400 to 0 at step 600.
* ``mlperf-v1``: D=128, bottom 13-512-256-128, top 1024-1024-512-256-1, tables capped at 40M rows.
* ``mlperf-v2``: MLPerf's DLRM-DCNv2: D=128, bottom 13-512-256-128, DCNv2 interaction (3 layers, rank 512), top
  1024-1024-512-256-1, multi-hot bags of fixed sizes per table (``multi_hot_sizes``, summed), the Criteo 1TB
  cardinalities capped at 40M (``cardinalities``: what ``fuselab dlrm synth --config mlperf-v2`` generates).
* ``tiny``: D=8, bottom 13-32-8, top 32-1, for tests and the CPU default run.

Table sizes are not part of the config: they come from the dataset's metadata
(:func:`table_sizes`). Any field can be overridden with ``key=value`` strings
(``--set lr_dense=0.1``; values parse as JSON, else as plain strings).

Learning rates: ``lr_dense`` / ``lr_sparse`` left unset (null) take the preset's ``learning_rates[optimizer]``
(``[dense, sparse]``), so ``--optimizer sgd`` gets SGD's rates, not Adagrad's. The learning-rate schedule
(:mod:`fuselab.dlrm.schedule`) is ``warmup_steps``, ``decay_start_step``, ``decay_steps``, ``decay_power``.

``bf16=true`` (the older flag) is read as ``precision="bf16"``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuselab.core.flags import DEVICE, Number, OneOf

CONFIG_DIR = Path(__file__).with_name("configs")
#: the configs shipped in CONFIG_DIR, by name (what ``--config`` accepts besides a .json/.toml file)
PRESETS = tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
NUM_DENSE = 13
#: directory of the synthetic dataset ``fuselab dlrm train`` makes when given no data
DEFAULT_SYNTH_DIR = "runs/dlrm/synth-tiny"
#: run directory of ``fuselab dlrm train`` (run.json; the checkpoint of an interrupted run without --checkpoint-dir)
DEFAULT_RUN_DIR = "runs/dlrm/train"
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
#: learning rates [dense, sparse] per optimizer when a config gives none (the tiny preset's, batch 1024)
DEFAULT_LEARNING_RATES = {"sgd": [1.0, 16.0], "adagrad": [0.02, 0.05], "rowwise_adagrad": [0.02, 0.05]}


@dataclass
class DLRMConfig:
    """Every knob of a DLRM run. ``bottom_mlp`` excludes the 13 inputs; its last width must equal
    ``embedding_dim``. ``top_mlp`` excludes the interaction width; its last width must be 1."""

    name: str = "custom"
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 64, 16])
    top_mlp: list[int] = field(default_factory=lambda: [512, 256, 1])
    interaction: str = "dot"  # dot | cat | dcn (DCNv2 low-rank cross network)
    self_interaction: bool = False
    dcn_num_layers: int = 3
    dcn_low_rank: int = 512
    #: ids per sample of each table (fixed-size bags, MLPerf's multi-hot); None: one id per table
    multi_hot_sizes: list[int] | None = None
    pooling: str = "sum"  # sum | mean, over each bag
    #: the tables of the synthetic data made for this config (``fuselab dlrm synth --config``); training reads the
    #: table sizes from the dataset
    cardinalities: list[int] | None = None
    hashing: str = "modulus"  # modulus | vocab
    max_rows_per_table: int | None = None
    embedding_layout: str = "fused"  # fused (one weight, row offsets per table) | per_table (nn.EmbeddingBag each)
    #: the tables' dtype: fp32, or fp16 / bf16 (half the memory; fp32 math, stochastically rounded updates; fused
    #: embedding layout with fuselab's kernels only)
    embedding_dtype: str = "fp32"
    sparse_grad: bool = True
    kernels: str = "auto"  # auto (fuselab on CUDA, torch on CPU) | fuselab | torch
    optimizer: str = "adagrad"  # sgd | adagrad | rowwise_adagrad (row-wise for the tables, element-wise for MLPs)
    lr_dense: float | None = None  # None: learning_rates[optimizer][0]
    lr_sparse: float | None = None  # None: learning_rates[optimizer][1]
    learning_rates: dict[str, list[float]] = field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_LEARNING_RATES.items()})
    adagrad_eps: float = 1e-8
    warmup_steps: int = 0  # linear warm-up from 0 over these steps
    decay_start_step: int = 0  # polynomial decay from here ...
    decay_steps: int = 0  # ... to 0 at decay_start_step + decay_steps (0: no decay)
    decay_power: float = 2.0
    batch_size: int = 8192
    eval_batch_size: int = 65536
    epochs: float = 1.0
    steps: int | None = None
    eval_every: int = 0
    eval_batches: int = 0
    precision: str = "fp32"  # fp32 | tf32 (TF32 matmuls) | bf16 (bf16 autocast)
    compile: bool = False
    cuda_graph: bool = False  # capture the whole step in a CUDA graph (exclusive with compile)
    data_on_device: bool = False  # hold the train split on the device, shuffle and batch there
    seed: int = 0
    shuffle: str = "batch"  # batch (contiguous batches, order permuted) | row (full permutation) | none
    prefetch: int = 3
    checkpoint_every: int = 0
    device: str | None = None
    #: several ranks: split a table row-wise when it holds more than this share of the tables' bytes per rank
    #: (None: only when it does not fit a rank's memory; whole tables keep the embedding exchange static)
    row_wise_share: float | None = None

    def __post_init__(self) -> None:
        rates = self.learning_rates.get(self.optimizer) if isinstance(self.learning_rates, dict) else None
        if rates is not None and len(rates) == 2:
            if self.lr_dense is None:
                self.lr_dense = float(rates[0])
            if self.lr_sparse is None:
                self.lr_sparse = float(rates[1])

    def validate(self) -> DLRMConfig:
        """Every field against its rule (:data:`FIELD_RULES`), then the rules between fields; ``ValueError``
        naming the config and the field."""
        def bad(what: str) -> ValueError:
            return ValueError(f"config {self.name!r}: {what}")

        for key in FIELD_RULES:
            try:
                _check_rule(key, getattr(self, key))
            except ValueError as err:
                raise bad(f"{key}: {err}") from None
        if self.interaction in ("dot", "dcn") and self.bottom_mlp[-1] != self.embedding_dim:
            raise bad(f"bottom_mlp must end at embedding_dim={self.embedding_dim} for the {self.interaction} "
                      f"interaction, got {self.bottom_mlp}")
        if self.top_mlp[-1] != 1:
            raise bad(f"top_mlp must be positive widths ending in 1, got {self.top_mlp}")
        self._validate_learning(bad)
        if self.embedding_dtype != "fp32" and (self.kernels == "torch" or self.embedding_layout != "fused"):
            raise bad(f"embedding_dtype={self.embedding_dtype} needs fuselab's embedding collection (kernels fuselab "
                      f"or auto, embedding_layout fused), got kernels={self.kernels}, "
                      f"embedding_layout={self.embedding_layout}")
        if self.compile and self.cuda_graph:
            raise bad("compile and cuda_graph are exclusive (the CUDA-graph step is captured eagerly)")
        return self

    def _validate_learning(self, bad) -> None:
        if not isinstance(self.learning_rates, dict) or any(
                not isinstance(v, list) or len(v) != 2 for v in self.learning_rates.values()):
            raise bad(f"learning_rates must map optimizer names to [lr_dense, lr_sparse], got {self.learning_rates}")
        if self.lr_dense is None or self.lr_sparse is None:
            raise bad(f"no learning rates for optimizer {self.optimizer!r}: set lr_dense and lr_sparse or "
                      f"learning_rates.{self.optimizer}")
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise bad(f"decay_start_step ({self.decay_start_step}) must not come before the end of the warm-up "
                      f"(warmup_steps={self.warmup_steps})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(DLRMConfig)}

_POSITIVE, _COUNT = Number(int, 1), Number(int, 0)
_RATE, _ABOVE_ZERO = Number(float, 0), Number(float, 0, low_open=True)
#: what each field may hold (a list field: each element; None is always allowed where the field's type allows it);
#: the same rules check ``--set``, the named flags of ``fuselab dlrm train`` and config files
FIELD_RULES: dict[str, Any] = {
    "embedding_dim": _POSITIVE, "bottom_mlp": _POSITIVE, "top_mlp": _POSITIVE, "dcn_num_layers": _POSITIVE,
    "dcn_low_rank": _POSITIVE, "multi_hot_sizes": _POSITIVE, "cardinalities": _POSITIVE,
    "max_rows_per_table": _POSITIVE, "batch_size": _POSITIVE, "eval_batch_size": _POSITIVE,
    "lr_dense": _RATE, "lr_sparse": _RATE, "adagrad_eps": _ABOVE_ZERO, "warmup_steps": _COUNT,
    "decay_start_step": _COUNT, "decay_steps": _COUNT, "decay_power": _ABOVE_ZERO, "epochs": _ABOVE_ZERO,
    "steps": _COUNT, "eval_every": _COUNT, "eval_batches": _COUNT, "seed": Number(int, 0, 2**63 - 1),
    "prefetch": _COUNT, "checkpoint_every": _COUNT, "row_wise_share": _ABOVE_ZERO, "device": DEVICE,
    "interaction": OneOf(("dot", "cat", "dcn")), "hashing": OneOf(("modulus", "vocab")),
    "optimizer": OneOf(OPTIMIZERS), "pooling": OneOf(("sum", "mean")),
    "embedding_layout": OneOf(("fused", "per_table")), "shuffle": OneOf(("batch", "row", "none")),
    "kernels": OneOf(("auto", "fuselab", "torch")), "precision": OneOf(("fp32", "tf32", "bf16")),
    "embedding_dtype": OneOf(("fp32", "fp16", "bf16")),
}


def _check_rule(key: str, value: Any) -> None:
    rule = FIELD_RULES.get(key)
    if rule is None or value is None:
        return
    if isinstance(value, list):
        if not value:
            raise ValueError("expected a non-empty list")
        for item in value:
            rule.check(item)
    else:
        rule.check(value)


def check_field(key: str, value: Any) -> Any:
    """``value`` of field ``key`` against :data:`FIELD_RULES` (lists element by element; a list field must not be
    empty); returns it, or raises ``ValueError`` naming the field and what it expects."""
    try:
        _check_rule(key, value)
    except ValueError as err:
        raise ValueError(f"config field {key!r}: {err}") from None
    return value


#: older field names still read: name -> function of the value giving (field, value)
_ALIASES = {"bf16": lambda v: ("precision", "bf16" if _coerce_bool("bf16", v) else "fp32")}


def _coerce_bool(key: str, value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"config field {key!r} expects true/false, got {value!r}")
        return value.lower() in ("true", "1")
    return bool(value)


def _coerce_item(key: str, value: Any) -> tuple[str, Any]:
    """(field, value) of a config entry: aliases resolved, the value coerced to the field's type."""
    if key in _ALIASES:
        key, value = _ALIASES[key](value)
    return key, check_field(key, _coerce(key, value))


def _coerce(key: str, value: Any) -> Any:
    if key not in _FIELDS:
        raise ValueError(f"unknown config field {key!r}; known: {', '.join(sorted(_FIELDS))}")
    kind = str(_FIELDS[key].type)
    if value is None:
        return None
    if kind.startswith("dict"):
        if not isinstance(value, dict):
            raise ValueError(f"config field {key!r} expects a mapping, got {value!r}")
        try:
            return {str(k): [float(x) for x in v] for k, v in value.items()}
        except (TypeError, ValueError):
            raise ValueError(f"config field {key!r} expects {{optimizer: [lr_dense, lr_sparse]}}, got {value!r}"
                             ) from None
    if kind.startswith("list"):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config field {key!r} expects a list of ints, got {value!r}")
        return [int(v) for v in value]
    if kind.startswith("bool"):
        return _coerce_bool(key, value)
    try:
        if kind.startswith("int"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            if isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
                raise ValueError
            return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"config field {key!r} expects {kind}, got {value!r}") from None
    return str(value)


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> (key, value); value parses as JSON (``[1,2]``, ``0.1``, ``true``), else a string."""
    if "=" not in text:
        raise ValueError(f"--set expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip().replace("-", "_")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return _coerce_item(key, value)


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise ValueError("TOML configs need Python >= 3.11 (tomllib); use JSON") from None
        with path.open("rb") as f:
            return tomllib.load(f)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"config file {path} is not valid JSON: {exc}") from None


def load_config(source: str | Path | None = None, overrides: list[str] | None = None, **named: Any) -> DLRMConfig:
    """Build a config from a preset name or a ``.json``/``.toml`` file, then ``--set`` overrides, then named
    overrides (CLI flags; ``None`` values are ignored). Raises ``ValueError`` naming a bad field."""
    source = source or "tiny"
    path = Path(source)
    if str(source) in PRESETS:
        data = _read_file(CONFIG_DIR / f"{source}.json")
    elif path.suffix in (".json", ".toml"):
        data = _read_file(path)
    else:
        raise ValueError(f"config must be one of {PRESETS} or a .json/.toml file, got {source!r}")
    values = dict(_coerce_item(key, value) for key, value in data.items())
    for text in overrides or []:
        key, value = parse_override(text)
        values[key] = value
    for key, value in named.items():
        if value is not None:
            key, value = _coerce_item(key, value)
            values[key] = value
    return DLRMConfig(**values).validate()


def config_from_dict(data: dict[str, Any]) -> DLRMConfig:
    """The config saved in a checkpoint or run.json (``to_dict()``), with older field names read as aliases."""
    return DLRMConfig(**dict(_coerce_item(key, value) for key, value in data.items())).validate()


def table_sizes(cfg: DLRMConfig, meta: dict[str, Any]) -> list[int]:
    """Rows of each embedding table from a dataset's metadata.

    ``modulus``: ``min(cardinality, max_rows_per_table)`` (ids are taken modulo this).
    ``vocab``: vocabulary size + 1 (row 0 holds every id rarer than the preprocessing threshold), capped.
    """
    if cfg.hashing == "vocab":
        if "vocab_sizes" not in meta:
            raise ValueError("hashing='vocab' needs a dataset preprocessed with a vocabulary (vocab_sizes in "
                             "metadata); synthetic and parquet datasets only support 'modulus'")
        sizes = [int(n) + 1 for n in meta["vocab_sizes"]]
    else:
        sizes = [max(1, int(n)) for n in meta["cardinalities"]]
    if cfg.max_rows_per_table:
        sizes = [min(n, cfg.max_rows_per_table) for n in sizes]
    return sizes


def check_layout(cfg: DLRMConfig, sizes: list[int], ds: Any) -> None:
    """The dataset's sparse columns fit the config: one per table, or the config's ``multi_hot_sizes`` (the
    dataset's own, when its metadata records them). Raises ``ValueError`` naming both."""
    width, bags = ds.num_sparse, ds.meta.get("multi_hot_sizes")
    if cfg.multi_hot_sizes is None:
        if bags is not None or width != len(sizes):
            raise ValueError(f"the dataset has {width} sparse columns{' (multi-hot bags)' if bags else ''} for "
                             f"{len(sizes)} tables; the config has no multi_hot_sizes")
        return
    if len(cfg.multi_hot_sizes) != len(sizes) or width != sum(cfg.multi_hot_sizes):
        raise ValueError(f"config multi_hot_sizes (sum {sum(cfg.multi_hot_sizes)}, {len(cfg.multi_hot_sizes)} "
                         f"tables) do not fit the dataset: {width} sparse columns, {len(sizes)} tables")
    if bags is not None and list(bags) != list(cfg.multi_hot_sizes):
        raise ValueError(f"config multi_hot_sizes {cfg.multi_hot_sizes[:8]} differ from the dataset's {bags[:8]}")
