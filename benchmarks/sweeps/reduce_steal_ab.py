"""Work stealing in the reduction kernels, on or off, and its item size and programs per SM, alternating in rounds.

    python3 benchmarks/sweeps/reduce_steal_ab.py [--rounds 3] [--cases all dim=0]

The prototype (``reduce_steal_proto.py``) lifted the all-element mean of 8192² bf16 from 0.81 to 0.85 of copy
bandwidth. Here the kernels' own stealing path (``_reduce_plan.STEAL``) runs every lab case, so it shows where else
it helps (``dim=-1``: tiles of whole rows) and where it costs. (The cols kernel had a stealing path in one run of this
script, ``probes/reduce_steal_ab.txt``: 0.24-0.45 against 0.68-0.83; it was removed.) Each variant: median over
rounds of CUDA events after a dirty flush (the lab's method) [min-max] | per call of 10 calls in a CUDA graph.
"""

from __future__ import annotations

import torch
from reduce_split_ab import alternate_and_report, selected, start  # benchmarks/sweeps/reduce_split_ab.py
from reduce_split_probe import _home, _variant  # benchmarks/sweeps/reduce_split_probe.py
from reduce_sweep import CASES  # benchmarks/sweeps/reduce_sweep.py

from fuselab.ops import _reduce_plan as P

KNOBS = ("STEAL", "STEAL_ITEM_BYTES", "STEAL_WARPS_PER_SM", "STEAL_MAX_PARTIALS", "STEAL_INT64")
VARIANTS = {  # name: knobs over the shipped ones
    "no stealing": dict(STEAL=None),
    "split plans steal, 32 KiB items, 32 warps/SM, int64": dict(STEAL="split",
                                                                STEAL_ITEM_BYTES=dict.fromkeys((2, 4, 8), 32768),
                                                                STEAL_WARPS_PER_SM=32, STEAL_INT64=True),
    "split plans steal, 64 KiB items": dict(STEAL="split", STEAL_ITEM_BYTES=dict.fromkeys((2, 4, 8), 65536)),
    "split plans steal, 32-bit offsets": dict(STEAL="split", STEAL_INT64=False),
    "split plans steal, 128 KiB items": dict(STEAL="split", STEAL_ITEM_BYTES=dict.fromkeys((2, 4, 8), 131072)),
    "split plans steal, 48 warps/SM": dict(STEAL="split", STEAL_WARPS_PER_SM=48),
    "every rows plan steals": dict(STEAL="all"),
    "every rows plan steals, 48 warps/SM": dict(STEAL="all", STEAL_WARPS_PER_SM=48),
}


def run(knobs: tuple[str, ...], variants_by_name: dict[str, dict], width: int = 50) -> None:
    """Time ``variants_by_name`` (name -> values of ``knobs`` over the shipped ones) on the lab's cases that
    ``--cases`` keeps, alternating in rounds; variants that give a case the same plan and launch are timed once."""
    args, copy = start(rounds=3)
    defaults = {name: getattr(_home(name), name) for name in knobs}
    for label, dtype, _, x, dims, frac in selected(CASES, args, copy):  # the lab's nine cases
        expected = x.double().mean(dim=dims)
        variants, seen = {}, []
        for name, values in variants_by_name.items():
            plan, fn = _variant(x, dims, **{**defaults, **values})
            launch_knobs = {k: v for k, v in values.items() if _home(k) is not P}
            if any(plan == p and launch_knobs == k for p, k in seen):
                continue  # the same plan and launch as an earlier variant (stealing does not apply to this case)
            seen.append((plan, launch_knobs))
            got = fn().double().view(expected.shape)
            assert torch.allclose(got, expected, rtol=1e-2, atol=1e-3), (name, (got - expected).abs().max().item())
            variants[name] = plan, fn
        alternate_and_report(label, dtype, variants, args.rounds, frac, width=width)
        del x, variants, expected
    for name, value in defaults.items():
        setattr(_home(name), name, value)


if __name__ == "__main__":
    run(KNOBS, VARIANTS)
