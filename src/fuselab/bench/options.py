"""The one place the lab's defaults live: the CLI reads its defaults from :class:`BenchOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fuselab.envinfo import device_slug

#: results go to ``<RESULTS_ROOT>/<device slug>``, relative to the current working directory, unless ``out`` is given
RESULTS_ROOT = Path("benchmarks") / "results"
#: ``fuselab bench compare``: a time ratio beyond 1 ± this is a regression / an improvement
COMPARE_THRESHOLD = 0.05


def default_out_dir() -> Path:
    """``benchmarks/results/<device slug>`` relative to the working directory (``h100``, ``cpu``, ...)."""
    return RESULTS_ROOT / device_slug()


@dataclass
class BenchOptions:
    """What ``fuselab bench`` (and :func:`fuselab.bench.run`) runs, and where it writes.

    ``ops``: op names (empty: every op in the registry). ``providers``: provider names to keep
    (None: all). ``dtypes`` / ``modes``: names (``fp32``, ``fwd``...; None: each suite's defaults).
    ``quick``: one or two sizes per op. ``out``: output folder (None: :func:`default_out_dir`).
    ``plot``: write PNGs. ``l2_cold``: time ``l2_cold`` cases over rotating input sets (GPU).
    ``cuda_graph``: capture each step (the whole rotation) in a CUDA graph and time its replay (fwd, fwd+bwd).
    ``stream``: on a GPU, also time each case's stream bound (:mod:`fuselab.bench.stream`: one kernel moving the
    case's bytes, timed the same way), reported as the row ``stream`` and each provider's ``of_stream``.
    ``cases``: case labels to keep (a label containing one of them; None: every case but a suite's opt-in ones,
    which run only when named in full). ``write``: write JSON/CSV files at all. ``wide``: print every column in the
    terminal tables (default: the columns that fit 100 terminal columns; the files hold every figure either way).
    ``command``: recorded in the JSON.
    """

    ops: tuple[str, ...] = ()
    providers: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    modes: tuple[str, ...] | None = None
    cases: tuple[str, ...] | None = None
    quick: bool = False
    out: Path | None = None
    plot: bool = False
    l2_cold: bool = False
    cuda_graph: bool = False
    stream: bool = True
    write: bool = True
    wide: bool = False
    command: str = field(default="")

    def out_dir(self) -> Path:
        """``out``, else :func:`default_out_dir` (its ``cuda_graph/`` folder with ``cuda_graph``, so graph replays
        never overwrite the plain results)."""
        if self.out is not None:
            return Path(self.out)
        return default_out_dir() / "cuda_graph" if self.cuda_graph else default_out_dir()
