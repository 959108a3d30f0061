"""The DLRM's interactions: one module per kind behind one protocol (:class:`~.base.Interaction`:
``out_features``, ``forward(dense, emb)``), chosen from :data:`INTERACTIONS` by the config's tagged sub-config
(``{"kind": "dcn", "layers": 3, "low_rank": 512}``; the kind alone, ``"dot"``, takes the defaults).

A new interaction: one file here (its options, a frozen dataclass subclassing :class:`~.base.InteractionConfig`, and
its module, built as ``Kind(config, num_sparse=, dim=, dense_dim=, fused=, generator=)``) and one line in
:data:`INTERACTIONS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .base import Interaction, InteractionConfig
from .cat import CatConfig, CatInteraction
from .dcn import DCNConfig, DCNInteraction, LowRankCrossNet
from .dot import DotConfig, DotInteraction, pair_indices, torchrec_permutation

#: every interaction module by its config's kind
INTERACTIONS: dict[str, type[nn.Module]] = {
    DotConfig.kind: DotInteraction,
    CatConfig.kind: CatInteraction,
    DCNConfig.kind: DCNInteraction,
}

__all__ = ["INTERACTIONS", "CatConfig", "CatInteraction", "DCNConfig", "DCNInteraction", "DotConfig",
           "DotInteraction", "Interaction", "InteractionConfig", "LowRankCrossNet", "build_interaction",
           "interaction_config", "pair_indices", "torchrec_permutation"]


def interaction_config(value: Any) -> InteractionConfig:
    """The options of an interaction from its tagged form: ``{"kind": KIND, **options}``, the kind alone (its
    defaults), or an :class:`InteractionConfig` (returned as is).

    Raises ValueError naming the unknown kind, an option the kind does not have (listing the ones it has), or a bad
    value."""
    if isinstance(value, InteractionConfig):
        return value
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise ValueError(f"interaction must be a kind ({', '.join(INTERACTIONS)}) or {{\"kind\": KIND, options...}}, "
                         f"got {value!r}")
    options = {key: v for key, v in value.items() if key != "kind"}
    module = INTERACTIONS.get(value["kind"])
    if module is None:
        raise ValueError(f"interaction kind must be one of {', '.join(INTERACTIONS)}, got {value['kind']!r}")
    config_class = module.config_class
    known = [f.name for f in dataclasses.fields(config_class)]
    for key in options:
        if key not in known:
            raise ValueError(f"interaction {config_class.kind!r} has no option {key!r}; its options: "
                             f"{', '.join(known) or 'none'}")
    return config_class(**options)


def build_interaction(config: InteractionConfig, *, num_sparse: int, dim: int, dense_dim: int, fused: bool,
                      generator: Any = None) -> Interaction:
    """The module of ``config``'s kind for F = ``num_sparse`` tables of dim ``dim`` after a dense arch of output
    width ``dense_dim`` (``fused``: its ``kernels="fuselab"`` implementation). Raises ValueError for widths that do
    not fit the kind."""
    return INTERACTIONS[config.kind](config, num_sparse=num_sparse, dim=dim, dense_dim=dense_dim, fused=fused,
                                     generator=generator)
