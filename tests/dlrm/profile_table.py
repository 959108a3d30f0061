"""Reading the kernels.txt table that `fuselab dlrm train --profile` writes."""

from __future__ import annotations


def table_rows(text: str) -> dict[str, tuple[float, float, float, float]]:
    """The body of a kernels.txt table: name -> (calls per step, µs per step, µs per call, share %)."""
    lines = text.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("┡")) + 1:]
    rows = {}
    for line in body:
        if line.startswith("└"):
            break
        name, calls, per_step, per_call, share = (cell.strip() for cell in line.strip("│").split("│"))
        rows[name] = (float(calls), float(per_step.removesuffix(" µs")), float(per_call.removesuffix(" µs")),
                      float(share.removesuffix("%")))
    return rows
