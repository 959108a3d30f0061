"""Host time per eager call of fuselab's hot paths, for an A/B of two source trees on the GPU machine.

    PYTHONPATH=OTHER/src python3 benchmarks/sweeps/host_ab.py   # the fuselab found first on the path

Tiny tensors (the GPU never falls behind), wall time of back-to-back calls, least of 5 means: the host is shared
and noise only ever adds time. ``torch.add`` is printed as the host's own speed in that process. Run it
alternately against both trees, several times: the host drifts by tens of percent between minutes.
"""

from __future__ import annotations

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch

import fuselab

SMOKE = not torch.cuda.is_available()  # a CPU check of the script itself (interpreter): one call per case


def host_us(fn, n: int = 400) -> float:
    return timing.host_us(fn, 1, 1, 1) if SMOKE else timing.host_us(fn, n)


def main() -> None:
    where = fuselab.__file__.split("/src/")[0].rsplit("/", 1)[-1] or "."
    dev, bf16 = ("cpu" if SMOKE else "cuda"), torch.bfloat16
    rows = []
    a = torch.randn(64, 512, device=dev)
    rows.append(("torch.add", host_us(lambda: torch.add(a, a))))
    x, r = torch.randn(64, 512, device=dev, dtype=bf16), torch.randn(64, 512, device=dev, dtype=bf16)
    b = torch.randn(512, device=dev, dtype=bf16)
    rows.append(("bias_act fwd", host_us(lambda: fuselab.bias_act(x, b, residual=r))))
    xg, rg, bg = (t.clone().requires_grad_(True) for t in (x, r, b))
    g = torch.randn_like(x)
    rows.append(("bias_act fwd+bwd", host_us(
        lambda: torch.autograd.backward([fuselab.bias_act(xg, bg, residual=rg, activation="gelu_tanh")], [g]))))
    q = torch.randn(64, 1, 32, 128, device=dev, dtype=bf16)
    k = torch.randn(64, 1, 8, 128, device=dev, dtype=bf16)
    cos, sin = fuselab.rope_cos_sin(4096, 128, device=dev)
    offsets = torch.randint(0, 4000, (64,), device=dev, dtype=torch.int32)
    rows.append(("rope decode, int offset", host_us(lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=9))))
    rows.append(("rope decode, tensor offsets", host_us(
        lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets))))
    rows.append(("rope decode, in place", host_us(
        lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets, inplace=True))))
    qg = torch.randn(2, 16, 8, 64, device=dev, dtype=bf16, requires_grad=True)
    kg = torch.randn(2, 16, 8, 64, device=dev, dtype=bf16, requires_grad=True)
    c16, s16 = fuselab.rope_cos_sin(16, 64, device=dev)
    gq, gk = torch.randn_like(qg), torch.randn_like(kg)
    rows.append(("rope fwd+bwd", host_us(lambda: torch.autograd.backward(list(fuselab.apply_rope(qg, kg, c16, s16)),
                                                                         [gq, gk]))))
    mlp = torch.nn.Sequential(*(fuselab.nn.FusedLinear(i, o, activation="relu", device=dev, dtype=bf16)
                                for i, o in ((13, 512), (512, 256), (256, 64), (64, 16))))
    xm = torch.randn(256, 13, device=dev, dtype=bf16)

    def mlp_step() -> None:
        mlp(xm).float().pow(2).mean().backward()

    rows.append(("FusedLinear MLP step (batch 256)", host_us(mlp_step, n=200)))
    ref = torch.nn.Sequential(*(m for i, o in ((13, 512), (512, 256), (256, 64), (64, 16))
                                for m in (torch.nn.Linear(i, o, device=dev, dtype=bf16), torch.nn.ReLU())))

    def ref_step() -> None:
        ref(xm).float().pow(2).mean().backward()

    rows.append(("eager MLP step (batch 256)", host_us(ref_step, n=200)))
    m = torch.randn(4096, 512, device=dev, dtype=bf16)
    rows.append(("mean dim=0", host_us(lambda: fuselab.mean(m, 0))))
    print(" | ".join([f"{where:8s}"] + [f"{name} {us:6.1f}" for name, us in rows]), flush=True)


if __name__ == "__main__":
    main()
