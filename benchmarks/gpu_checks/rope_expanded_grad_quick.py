"""GPU check of issue 41 item 9: apply_rope(bshd, positions) backward with an expanded (stride-0) upstream gradient.

Prints the max error against a float64 reference for the fast launcher and the plain ``kernel[grid]`` launch, first
call and repeated call, and which (b, s) tokens are wrong."""
import torch

import fuselab
import fuselab.ops as ops
from fuselab.ops import _launch
from fuselab.reference import rope as ref


def case(dtype, rotary, layout, expanded, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, s, h, d = 2, 64, 4, 64
    shape = (b, s, h, d) if layout == "bshd" else (s, b, h, d)
    x = torch.randn(shape, device="cuda", generator=g).to(dtype)
    cos, sin = fuselab.rope_cos_sin(256, rotary, device="cuda")
    pos = torch.randint(0, 256, (b, s), device="cuda", generator=g)
    t = x.clone().requires_grad_()
    out, _ = fuselab.apply_rope(t, None, cos, sin, layout=layout, positions=pos)
    if expanded:
        (out.sum() * 2).backward()
    else:
        out.backward(torch.full_like(out, 2.0))
    t64 = x.double().requires_grad_()
    o64, _ = ref.apply_rope(t64, None, cos.double(), sin.double(), layout=layout, positions=pos)
    o64.backward(torch.full_like(o64, 2.0))
    err = (t.grad.double() - t64.grad).abs()
    tok = err.amax(dim=(2, 3)) if layout == "bshd" else err.amax(dim=(2, 3)).t()
    wrong = (tok > 0.05).nonzero().tolist()
    return err.max().item(), wrong[:6], len(wrong)


def main():
    fast = _launch._runtime_knobs
    for launcher in ("fast", "fallback"):
        _launch._runtime_knobs = fast if launcher == "fast" else (lambda: None)
        ops.clear()
        for dtype in (torch.float32, torch.bfloat16):
            for rotary in (64, 32):
                for layout in ("bshd", "sbhd"):
                    for expanded in (True, False):
                        for rep in range(2):
                            e, wrong, n = case(dtype, rotary, layout, expanded, seed=rep)
                            flag = "WRONG" if e > 0.05 else "ok"
                            print(f"{launcher:8s} {str(dtype)[6:]:8s} rot={rotary} {layout} expanded={expanded!s:5s} "
                                  f"call={rep} max_err={e:.3g} {flag} wrong_tokens={n} {wrong}")
    _launch._runtime_knobs = fast


main()
