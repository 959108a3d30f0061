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
(:func:`fuselab.dlrm.layout.table_sizes`). Any field can be overridden with ``key=value`` strings
(``--set lr_dense=0.1``; values parse as JSON, else as plain strings).

The interaction is a tagged sub-config, ``{"kind": "dcn", "layers": 3, "low_rank": 512}`` (the kind alone,
``"dot"``, takes its defaults; the kinds and their options: :mod:`fuselab.dlrm.interaction`); ``--set
interaction.low_rank=256`` changes one option. The optimizer is read once into
:attr:`DLRMConfig.embedding_optimizer` (:mod:`fuselab.core.embedding_optimizer`; ``adagrad_eps`` is its eps).
Parsing an interaction imports torch (its kinds are modules); nothing here is imported before a config is read.

Learning rates: ``lr_dense`` / ``lr_sparse`` left unset (null) take the preset's ``learning_rates[optimizer]``
(``[dense, sparse]``), so ``--optimizer sgd`` gets SGD's rates, not Adagrad's. The learning-rate schedule
(:mod:`fuselab.dlrm.schedule`) is ``warmup_steps``, ``decay_start_step``, ``decay_steps``, ``decay_power``.

Older spellings still read: ``bf16=true`` as ``precision="bf16"``; ``interaction="dcn"`` with ``dcn_num_layers``,
``dcn_low_rank`` and ``self_interaction`` as the tagged sub-config's options (in a whole config dict an option the
kind does not have is dropped: older configs listed every field); ``embedding_layout`` (``"fused"`` or
``"per_table"``) is dropped: the tables are one weight in every kernels path, with the same values.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuselab.core.embedding_optimizer import EMBEDDING_OPTIMIZERS, EmbeddingOptimizer, embedding_optimizer
from fuselab.core.flags import DEVICE, Number, OneOf
from fuselab.core.reductions import REDUCTIONS

if TYPE_CHECKING:
    from .interaction import InteractionConfig

CONFIG_DIR = Path(__file__).with_name("configs")
#: the configs shipped in CONFIG_DIR, by name (what ``--config`` accepts besides a .json/.toml file)
PRESETS = tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
NUM_DENSE = 13
#: directory of the synthetic dataset ``fuselab dlrm train`` makes when given no data
DEFAULT_SYNTH_DIR = "runs/dlrm/synth-tiny"
#: run directory of ``fuselab dlrm train`` (run.json; the checkpoint of an interrupted run without --checkpoint-dir)
DEFAULT_RUN_DIR = "runs/dlrm/train"
#: the embedding optimizers' names (the CLI's choices)
OPTIMIZERS = tuple(EMBEDDING_OPTIMIZERS)
#: the model's implementations (``DLRM.from_config(kernels=...)``); a config also takes "auto"
KERNELS = ("torch", "fuselab")
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
    #: the tagged sub-config ({"kind": "dot"} by default; :mod:`fuselab.dlrm.interaction`)
    interaction: InteractionConfig = field(default_factory=lambda: _interaction("dot"))
    #: ids per sample of each table (fixed-size bags, MLPerf's multi-hot); None: one id per table
    multi_hot_sizes: list[int] | None = None
    pooling: str = "sum"  # sum | mean, over each bag
    #: the tables of the synthetic data made for this config (``fuselab dlrm synth --config``); training reads the
    #: table sizes from the dataset
    cardinalities: list[int] | None = None
    hashing: str = "modulus"  # modulus | vocab
    max_rows_per_table: int | None = None
    #: the tables' dtype: fp32, or fp16 / bf16 (half the memory; fp32 math, stochastically rounded updates;
    #: fuselab's embedding collection only)
    embedding_dtype: str = "fp32"
    sparse_grad: bool = True  # kernels="torch": sparse COO gradients of the tables (False: dense ones)
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
    #: capture the whole step in a CUDA graph (with compile: the compiled step); "auto": on CUDA with the fused kernels
    cuda_graph: bool | str = False
    data_on_device: bool = False  # hold the train split on the device, shuffle and batch there
    #: CUDA-graph step on CUDA: the lookup (and its exchanges) on a side stream beside the bottom MLP
    overlap: bool = True
    seed: int = 0
    shuffle: str = "batch"  # batch (contiguous batches, order permuted) | row (full permutation) | none
    prefetch: int = 3
    checkpoint_every: int = 0
    device: str | None = None
    #: several ranks: split a table row-wise when it holds more than this share of the tables' bytes per rank
    #: (None: only when it does not fit a rank's memory; whole tables keep the embedding exchange static)
    row_wise_share: float | None = None
    #: several ranks, CUDA-graph step: replicate the tables whose gradient all-reduce moves fewer bytes than
    #: exchanging their pooled rows (small tables; the plan lists them)
    data_parallel_tables: bool = True

    def __post_init__(self) -> None:
        self.interaction = _interaction(self.interaction)
        rates = self.learning_rates.get(self.optimizer) if isinstance(self.learning_rates, dict) else None
        if rates is not None and len(rates) == 2:
            if self.lr_dense is None:
                self.lr_dense = float(rates[0])
            if self.lr_sparse is None:
                self.lr_sparse = float(rates[1])

    @property
    def embedding_optimizer(self) -> EmbeddingOptimizer:
        """The tables' optimizer: ``optimizer`` with ``adagrad_eps`` (the one place the name is read; ValueError
        naming ``optimizer`` for an unknown one)."""
        return embedding_optimizer(self.optimizer, eps=self.adagrad_eps)

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
        try:
            self.interaction.check_widths(self.bottom_mlp[-1], self.embedding_dim)
        except ValueError as exc:
            raise bad(f"{exc}, got bottom_mlp={self.bottom_mlp}") from None
        if self.top_mlp[-1] != 1:
            raise bad(f"top_mlp must be positive widths ending in 1, got {self.top_mlp}")
        self._validate_learning(bad)
        if self.embedding_dtype != "fp32" and self.kernels == "torch":
            raise bad(f"embedding_dtype={self.embedding_dtype} needs fuselab's embedding collection (kernels fuselab "
                      f"or auto), got kernels={self.kernels}")
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
        """Every field, JSON-ready (the interaction in its tagged form)."""
        return {**dataclasses.asdict(self), "interaction": self.interaction.to_dict()}


def _interaction(value: Any) -> InteractionConfig:
    """The interaction's options from their tagged form (:func:`fuselab.dlrm.interaction.interaction_config`)."""
    from .interaction import interaction_config  # its kinds are torch modules: imported when a config is read

    return interaction_config(value)


_FIELDS = {f.name: f for f in dataclasses.fields(DLRMConfig)}

_POSITIVE, _COUNT = Number(int, 1), Number(int, 0)
_RATE, _ABOVE_ZERO = Number(float, 0), Number(float, 0, low_open=True)
#: what each field may hold (a list field: each element; None is always allowed where the field's type allows it);
#: the same rules check ``--set``, the named flags of ``fuselab dlrm train`` and config files
FIELD_RULES: dict[str, Any] = {
    "embedding_dim": _POSITIVE, "bottom_mlp": _POSITIVE, "top_mlp": _POSITIVE,
    "multi_hot_sizes": _POSITIVE, "cardinalities": _POSITIVE,
    "max_rows_per_table": _POSITIVE, "batch_size": _POSITIVE, "eval_batch_size": _POSITIVE,
    "lr_dense": _RATE, "lr_sparse": _RATE, "adagrad_eps": _ABOVE_ZERO, "warmup_steps": _COUNT,
    "decay_start_step": _COUNT, "decay_steps": _COUNT, "decay_power": _ABOVE_ZERO, "epochs": _ABOVE_ZERO,
    "steps": _COUNT, "eval_every": _COUNT, "eval_batches": _COUNT, "seed": Number(int, 0, 2**63 - 1),
    "prefetch": _COUNT, "checkpoint_every": _COUNT, "row_wise_share": _ABOVE_ZERO, "device": DEVICE,
    "hashing": OneOf(("modulus", "vocab")),
    "optimizer": OneOf(OPTIMIZERS), "pooling": OneOf(REDUCTIONS), "shuffle": OneOf(("batch", "row", "none")),
    "kernels": OneOf(("auto", *KERNELS)), "precision": OneOf(("fp32", "tf32", "bf16")),
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
#: older top-level names of the interaction's options: name -> the option
_INTERACTION_OPTIONS = {"self_interaction": "self_interaction", "dcn_num_layers": "layers", "dcn_low_rank": "low_rank"}


def _embedding_layout(value: Any) -> None:
    """The older ``embedding_layout`` field: both of its layouts held the same tables, now always one weight."""
    if value not in ("fused", "per_table"):
        raise ValueError(f"embedding_layout must be 'fused' or 'per_table' (both read as one weight), got {value!r}")


def _coerce_bool(key: str, value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"config field {key!r} expects true/false, got {value!r}")
        return value.lower() in ("true", "1")
    return bool(value)


def _coerce_item(key: str, value: Any) -> tuple[str, Any]:
    """(field, value) of a config entry: aliases resolved, the value coerced to the field's type (the interaction's
    keys are returned as given: :func:`_put` merges them)."""
    if key in _ALIASES:
        key, value = _ALIASES[key](value)
    if key in ("interaction", "embedding_layout") or key in _INTERACTION_OPTIONS or key.startswith("interaction."):
        return key, value
    return key, check_field(key, _coerce(key, value))


def _put(values: dict[str, Any], key: str, value: Any, *, whole: bool = False) -> None:
    """Set the config entry ``key`` in ``values`` (:func:`_coerce_item`); the interaction's options
    (``interaction.KEY``, or an older top-level name) are merged into its tagged sub-config. ``whole``: entries of a
    whole config dict, where an option the interaction's kind does not have is dropped (older configs listed every
    field). Raises ValueError naming a bad field or option."""
    key, value = _coerce_item(key, value)
    if key == "embedding_layout":
        _embedding_layout(value)
        return
    option = key.removeprefix("interaction.") if key.startswith("interaction.") else _INTERACTION_OPTIONS.get(key)
    if option is not None:
        current = values["interaction"] if "interaction" in values else _interaction("dot")
        if not (whole and option not in current.to_dict()):
            values["interaction"] = _interaction({**current.to_dict(), option: value})
        return
    values[key] = _interaction(value) if key == "interaction" else value


def _from_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of a whole config dict (a file, a checkpoint's), the interaction read before its options."""
    values: dict[str, Any] = {}
    for key in sorted(data, key=lambda k: k != "interaction"):
        _put(values, key, data[key], whole=True)
    return values


def _coerce(key: str, value: Any) -> Any:
    if key not in _FIELDS:
        raise ValueError(f"unknown config field {key!r}; known: {', '.join(sorted(_FIELDS))} (and the "
                         "interaction's options as interaction.KEY)")
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
        if "str" in kind and isinstance(value, str) and value.lower() not in ("true", "false", "1", "0"):
            if value.lower() != "auto":
                raise ValueError(f"config field {key!r} expects true, false or auto, got {value!r}")
            return "auto"
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
    key, value = _coerce_item(key, value)
    if key == "interaction":  # its kind and options are known here; an option alone waits for the kind it joins
        try:
            _interaction(value)
        except ValueError as err:
            raise ValueError(f"config field 'interaction': {err}") from None
    return key, value


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
    values = _from_dict(data)
    for text in overrides or []:
        _put(values, *parse_override(text))
    for key, value in named.items():
        if value is not None:
            _put(values, key, value)
    return DLRMConfig(**values).validate()


def config_from_dict(data: dict[str, Any]) -> DLRMConfig:
    """The config saved in a checkpoint or run.json (``to_dict()``), with older field names read as aliases."""
    return DLRMConfig(**_from_dict(data)).validate()
