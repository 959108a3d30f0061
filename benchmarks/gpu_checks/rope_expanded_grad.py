"""Issue 41 item 9 on a GPU: apply_rope's gradient when the upstream gradient is expanded (``(out.sum() * 2)``).

    PYTHONPATH=src python benchmarks/gpu_checks/rope_expanded_grad.py [--device cuda] [--shape B,S,H,D ...]

For each case (bshd with a (batch, seq) positions tensor: the reported failure; sbhd and a materialized gradient as
controls), each output allocation (``torch.empty_like``, and filled with NaN first, so that an element the kernel
never writes shows as NaN), each launcher (the fast path and the plain ``kernel[grid]`` fallback) and each call (the
first, on empty caches, and a repeat of the same signature), one line: the largest error of the gradient against
float64 and how many elements are wrong. Under a failing line, the pattern of the wrong elements: which (b, s)
tokens, heads and dims; how many are NaN; for each wrong token the table row whose rotation explains its values
(another token's angle?), or the forward rotation (the conjugate lost?). Then the same rotation launched directly on
the expanded gradient and on a contiguous copy of it (no autograd): which of the two is wrong tells the kernel's
stride handling apart from the autograd path. Last, the plan of the backward (grid, constexprs, scalars). Exit status
1 when any case is wrong. Run it a second time with ``CUDA_LAUNCH_BLOCKING=1``: a failure that goes away then is a
matter of ordering (streams, memory reuse), not of the kernel or its arguments.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

import fuselab
from fuselab.ops import _launch
from fuselab.ops.rope import checks as rope_checks
from fuselab.ops.rope import launch as rope_launch
from fuselab.reference import rope as ref

#: (name, layout, dtype, rotary dims (None: all), q transposed in memory, upstream gradient expanded)
CASES = (
    ("bshd fp32 full expanded", "bshd", torch.float32, None, False, True),
    ("bshd bf16 partial expanded transposed", "bshd", torch.bfloat16, 4, True, True),
    ("bshd fp16 full expanded", "bshd", torch.float16, None, False, True),
    ("bshd fp32 full materialized (control)", "bshd", torch.float32, None, False, False),
    ("sbhd fp32 full expanded (control)", "sbhd", torch.float32, None, False, True),
)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _poisoned_empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t).fill_(float("nan"))


def make_inputs(layout: str, dtype, rotary, transposed: bool, shape, device):
    b, s, h, d = shape
    torch.manual_seed(0)
    phys = (b, s, h, d) if layout == "bshd" else (s, b, h, d)
    if transposed:  # the same logical tensor stored heads-major
        q = torch.randn(phys[2], phys[0], phys[1], d, device=device).to(dtype).permute(1, 2, 0, 3)
    else:
        q = torch.randn(phys, device=device).to(dtype)
    rows = 16
    cos, sin = fuselab.rope_cos_sin(rows, rotary or d, device=device)
    positions = torch.randint(0, rows, (b, s), device=device)
    return q, cos, sin, positions


def gradient(q, cos, sin, positions, layout, expanded: bool) -> torch.Tensor:
    t = q.detach().clone().requires_grad_(True)  # clone keeps q's strides (dense)
    out, _ = fuselab.apply_rope(t, None, cos, sin, layout=layout, positions=positions)
    if expanded:
        (out.sum() * 2).backward()
    else:
        out.backward(torch.full_like(out, 2.0))
    _sync(q)
    return t.grad


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def reference(q, cos, sin, positions, layout) -> torch.Tensor:
    t = q.detach().double().requires_grad_(True)
    out, _ = ref.apply_rope(t, None, cos.double(), sin.double(), layout=layout, positions=positions)
    out.backward(torch.full_like(out, 2.0))
    return t.grad


def wrong_mask(got, want, dtype) -> torch.Tensor:
    g = got.double()
    return ~((g - want).abs() <= TOLERANCE[dtype] * (1 + want.abs())) | torch.isnan(g)


def pattern(got, want, mask, cos, sin, positions, layout, half):
    """Lines describing the wrong elements, in (b, s, h, d) of the logical view."""
    g, m = ref.to_bshd(got, layout).double().cpu(), ref.to_bshd(mask, layout).cpu()
    b, s, h, d = g.shape
    lines = [f"    wrong: {int(m.sum())} of {m.numel()}; NaN (never written): {int(torch.isnan(g).sum())}"]
    tokens = sorted({(int(i), int(j)) for i, j, _, _ in m.nonzero().tolist()})
    lines.append(f"    tokens (b, s) wrong: {tokens[:24]}{' ...' if len(tokens) > 24 else ''} of {b * s}")
    lines.append(f"    heads wrong: {sorted({int(x) for x in m.nonzero()[:, 2].tolist()})} of {h}; "
                 f"dims wrong: {sorted({int(x) for x in m.nonzero()[:, 3].tolist()})} of {d}")
    c64, s64 = cos.double().cpu(), sin.double().cpu()
    pos = positions.cpu()
    for bi, si in tokens[:8]:
        vals = g[bi, si, 0, : 2 * half]
        best = None
        for conj in (True, False):
            for row in range(c64.shape[0]):
                c, sn = c64[row], (-s64[row] if conj else s64[row])
                x = torch.full((2 * half,), 2.0, dtype=torch.float64)
                rot = torch.cat((x[:half] * c - x[half:] * sn, x[half:] * c + x[:half] * sn))
                err = float((rot - vals).abs().max())
                if best is None or err < best[0]:
                    best = (err, row, conj)
        owners = [(int(i), int(j)) for i, j in (pos == best[1]).nonzero().tolist()]
        lines.append(f"    token ({bi}, {si}) at row {int(pos[bi, si])}: values fit row {best[1]} "
                     f"({'conjugate' if best[2] else 'FORWARD'} rotation, err {best[0]:.2e}); tokens at that row: "
                     f"{owners[:6]}")
    return lines


def direct(q, cos, sin, positions, layout, plain: bool) -> list[str]:
    """The backward's rotation launched directly (no autograd, outputs NaN first) on an expanded gradient and on a
    contiguous copy of it."""
    g = torch.tensor(2.0, device=q.device, dtype=q.dtype).expand(q.shape)
    want = reference(q, cos, sin, positions, layout)
    lines = []
    for name, grad in (("expanded", g), ("contiguous", g.contiguous())):
        call = rope_checks.RopeCall(layout=layout, half=cos.shape[1], interleaved=False, conj=True)
        operands = (grad, None, cos, sin, None, positions, None, None, 0)
        out = _poisoned_empty_like(grad)
        plan = rope_launch.plan(call, operands)
        for _ in range(2):  # the second launch reuses the compiled kernel on the fast path
            if plain:
                with _launch.plain_launches():
                    rope_launch.rotate(plan, operands, out, None)
            else:
                rope_launch.rotate(plan, operands, out, None)
        _sync(q)
        mask = wrong_mask(out, want, q.dtype)
        lines.append(f"    direct launch on the {name} gradient: max err "
                     f"{float((out.double() - want).abs().nan_to_num(float('inf')).max()):.2e}, "
                     f"wrong {int(mask.sum())}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", action="append", help="batch,seq,heads,head_dim; repeatable (default: 2,3,2,8 "
                        "and 2,64,8,64)")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, triton {__import__('triton').__version__}, "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else device}")
    failed = False
    for text in args.shape or ["2,3,2,8", "2,64,8,64"]:
        shape = tuple(int(v) for v in text.split(","))
        print(f"-- shape {shape}")
        failed |= run_cases(shape, device)
    q, cos, sin, positions = make_inputs("bshd", torch.float32, None, False, shape, device)
    g = torch.tensor(2.0, device=device).expand(q.shape)
    call = rope_checks.RopeCall(layout="bshd", half=cos.shape[1], interleaved=False, conj=True)
    plan = rope_launch.plan(call, (g, None, cos, sin, None, positions, None, None, 0))
    if plan.launch is not None:
        print(f"plan of the backward (bshd fp32 expanded, last shape): grid {plan.launch.grid}, scalars "
              f"{plan.launch.scalars}")
        print(f"  constexprs {plan.launch.constexprs}")
    print("launches by path:", _launch.counts)
    return 1 if failed else 0


def run_cases(shape: tuple[int, ...], device: torch.device) -> bool:
    """Every case at ``shape``; True when one is wrong."""
    failed = False
    for name, layout, dtype, rotary, transposed, expanded in CASES:
        q, cos, sin, positions = make_inputs(layout, dtype, rotary, transposed, shape, device)
        want = reference(q, cos, sin, positions, layout)
        for alloc, launcher, call in itertools.product(("empty", "NaN"), ("fast", "plain"), ("first", "repeat")):
            rope_launch._empty_like = _poisoned_empty_like if alloc == "NaN" else torch.empty_like
            if call == "first":
                fuselab.ops.clear()
            if launcher == "plain":
                with _launch.plain_launches():
                    got = gradient(q, cos, sin, positions, layout, expanded)
            else:
                got = gradient(q, cos, sin, positions, layout, expanded)
            mask = wrong_mask(got, want, dtype)
            err = float((got.double() - want).abs().nan_to_num(float("inf")).max())
            print(f"{name:40s} {alloc:5s} {launcher:5s} {call:6s} max err {err:.2e}  "
                  f"wrong {int(mask.sum())}/{mask.numel()}")
            if mask.any():
                failed = True
                for line in pattern(got, want, mask, cos, sin, positions, layout, cos.shape[1]):
                    print(line)
        if expanded:
            for line in direct(q, cos, sin, positions, layout, plain=False):
                print(line + " (fast launcher)")
            for line in direct(q, cos, sin, positions, layout, plain=True):
                print(line + " (plain launcher)")
    return failed


if __name__ == "__main__":
    sys.exit(main())
