"""What every interaction offers (:class:`Interaction`), and the base of each kind's options
(:class:`InteractionConfig`, the config's tagged sub-config).

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim, ``D_dense`` the dense arch's output width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from torch import Tensor


class Interaction(Protocol):
    """The DLRM's interaction arch: the dense vector meets the F pooled embeddings.

    ``forward(dense (B, D_dense), emb (B, F, D)) -> (B, out_features)``. An implementation may append zero columns up
    to a multiple of :data:`fuselab.nn.mlp.INPUT_ALIGN` (the fused dot interaction writes them for free); the over
    arch's first layer takes its input padded or not. Each kind is a module built as
    ``Kind(config, num_sparse=F, dim=D, dense_dim=D_dense, fused=..., generator=...)`` (``fused``: the
    ``kernels="fuselab"`` implementation where the kind has one).
    """

    out_features: int

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class InteractionConfig:
    """A kind's options: the fields of a frozen dataclass, the keys of the tagged sub-config besides ``kind``
    (``{"kind": "dcn", "layers": 3, "low_rank": 512}``). Subclasses check their values in ``__post_init__``
    (ValueError naming ``interaction.<key>``)."""

    #: the tag
    kind: ClassVar[str] = ""
    #: the kind mixes the dense vector with the embeddings: the dense arch must end at the embedding dim
    needs_equal_widths: ClassVar[bool] = True

    def check_widths(self, dense_dim: int, dim: int) -> None:
        """ValueError when the dense arch's output width ``dense_dim`` does not fit the embedding dim ``dim``."""
        if self.needs_equal_widths and dense_dim != dim:
            raise ValueError(f"the {self.kind} interaction needs the dense arch's output width ({dense_dim}) to "
                             f"equal the embedding dim ({dim}): bottom_mlp must end at embedding_dim")

    def to_dict(self) -> dict[str, Any]:
        """The tagged form (JSON-ready)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


def positive_int(key: str, value: object) -> int:
    """``value`` as a positive int; ValueError naming ``interaction.<key>`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"interaction.{key} must be a positive int, got {value!r}")
    return value
