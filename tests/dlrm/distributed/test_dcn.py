"""DCNv2 interaction vs a float64 per-element loop reference written here; gradients (gradcheck); init; errors."""

from __future__ import annotations

import pytest
import torch

from fuselab.dlrm.interaction import DCNConfig, DCNInteraction, LowRankCrossNet


def loop_reference(dense, emb, V, W, bias):
    """x_{l+1}[b, i] = x0[b, i] * (sum_j W_l[i, j] sum_k V_l[j, k] x_l[b, k] + b_l[i]) + x_l[b, i], float64."""
    b_count, f_count, d = emb.shape
    n = (f_count + 1) * d
    x0 = [[0.0] * n for _ in range(b_count)]
    for b in range(b_count):
        for i in range(d):
            x0[b][i] = float(dense[b, i])
        for f in range(f_count):
            for i in range(d):
                x0[b][(f + 1) * d + i] = float(emb[b, f, i])
    x = [row[:] for row in x0]
    for v, w, c in zip(V, W, bias):
        rank = v.shape[0]
        new = []
        for b in range(b_count):
            low = [sum(float(v[j, k]) * x[b][k] for k in range(n)) for j in range(rank)]
            new.append([x0[b][i] * (sum(float(w[i, j]) * low[j] for j in range(rank)) + float(c[i])) + x[b][i]
                        for i in range(n)])
        x = new
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("b_count,f_count,d,rank,layers", [(3, 2, 3, 4, 3), (1, 5, 2, 1, 1), (4, 1, 5, 7, 2)])
def test_forward_per_element(b_count, f_count, d, rank, layers):
    gen = torch.Generator().manual_seed(b_count * 100 + f_count)
    arch = DCNInteraction(DCNConfig(layers=layers, low_rank=rank), num_sparse=f_count, dim=d, dense_dim=d,
                          generator=gen)
    with torch.no_grad():
        for bias in arch.crossnet.bias:
            bias.normal_(0.0, 0.5, generator=gen)  # zero at init: make the bias term count
    dense = torch.randn(b_count, d, generator=gen)
    emb = torch.randn(b_count, d, f_count, generator=gen).transpose(1, 2)  # strided (B, F, D) view
    out = arch(dense, emb)
    net = arch.crossnet
    ref = loop_reference(dense, emb, *([p.detach() for p in ps] for ps in (net.V, net.W, net.bias)))
    assert out.shape == (b_count, (f_count + 1) * d) and out.dtype == torch.float32
    tol = 1e-5 + 1e-5 * ref.abs()
    assert ((out.double() - ref).abs() <= tol).all(), (out.double() - ref).abs().max()
    out64 = arch.double()(dense.double(), emb.double())
    torch.testing.assert_close(out64, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("b_count,f_count,d,rank,layers", [(5, 2, 3, 4, 3), (7, 3, 5, 2, 2)])
def test_fused_cross_layers_match_float64(b_count, f_count, d, rank, layers, backend, device):
    """fused=True (one fuselab.dcn_cross per layer: the kernels, compiled on a GPU or under the interpreter, or the
    PyTorch path) against the per-element loop (forward) and float64 autograd of the unfused layers (every gradient),
    float32. Values are drawn on the CPU and moved to where the kernels run."""
    gen = torch.Generator().manual_seed(7 * b_count + layers)
    with torch.device("cpu"):
        arch = DCNInteraction(DCNConfig(layers=layers, low_rank=rank), num_sparse=f_count, dim=d, dense_dim=d,
                              fused=True, generator=gen)
        with torch.no_grad():
            for bias in arch.crossnet.bias:
                bias.normal_(0.0, 0.5, generator=gen)
        dense = torch.randn(b_count, d, generator=gen)
        emb = torch.randn(b_count, d, f_count, generator=gen)
        grad = torch.randn(b_count, (f_count + 1) * d, generator=gen)
        ref_arch = DCNInteraction(DCNConfig(layers=layers, low_rank=rank), num_sparse=f_count, dim=d, dense_dim=d)
        net = arch.crossnet  # the references on the CPU too, whatever the default device
        ref = loop_reference(dense, emb.transpose(1, 2), *([p.detach() for p in ps] for ps in (net.V, net.W,
                                                                                                net.bias)))
        ref_arch.load_state_dict(arch.state_dict())
        ref_arch.double()
        leaves = [dense.double().requires_grad_(), emb.double().transpose(1, 2).requires_grad_()]
        want = torch.autograd.grad(ref_arch(*leaves), [*leaves, *ref_arch.parameters()], grad.double())
    on = device if backend == "triton" else torch.device("cpu")
    arch.to(on)
    x = [dense.to(on).requires_grad_(), emb.to(on).transpose(1, 2).requires_grad_()]  # emb: a strided view
    out = arch(*x)
    tol = 1e-5 + 1e-5 * ref.abs()
    assert ((out.double().cpu() - ref).abs() <= tol).all(), (out.double().cpu() - ref).abs().max()
    got = torch.autograd.grad(out, [*x, *arch.parameters()], grad.to(on))
    for name, g, w in zip(["dense", "emb", *(f"param {i}" for i in range(len(want) - 2))], got, want):
        assert g.dtype == torch.float32, name
        err = (g.double().cpu() - w).abs()
        assert (err <= 1e-4 + 1e-4 * w.abs()).all(), (name, err.max())


def test_fused_cross_layers_under_bf16_autocast():
    """Under autocast the fused layers cast x0 and the weights to bf16 themselves: a bf16 output near the float64
    value, float32 gradients for the float32 parameters."""
    gen = torch.Generator().manual_seed(3)
    net = LowRankCrossNet(24, num_layers=2, low_rank=4, generator=gen, fused=True)
    x0 = torch.randn(6, 24, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x0)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in net.parameters())
    ref = LowRankCrossNet(24, num_layers=2, low_rank=4)
    ref.load_state_dict(net.state_dict())
    torch.testing.assert_close(out.double(), ref.double()(x0.double()), rtol=5e-2, atol=5e-2)


def test_gradients_float64():
    gen = torch.Generator().manual_seed(0)
    net = LowRankCrossNet(6, num_layers=2, low_rank=3, generator=gen).double()
    with torch.no_grad():
        for bias in net.bias:
            bias.normal_(generator=gen)
    x = torch.randn(3, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(net, (x,))
    params = [*net.V, *net.W, *net.bias]
    assert torch.autograd.gradcheck(lambda *p: torch.func.functional_call(
        net, {**{f"V.{i}": p[i] for i in range(2)}, **{f"W.{i}": p[2 + i] for i in range(2)},
              **{f"bias.{i}": p[4 + i] for i in range(2)}}, (x.detach(),)),
        tuple(q.detach().requires_grad_() for q in params))


def test_init_and_shapes():
    gen = torch.Generator().manual_seed(1)
    net = LowRankCrossNet(3456, num_layers=3, low_rank=512, generator=gen)  # MLPerf DLRM-DCNv2
    assert [tuple(v.shape) for v in net.V] == [(512, 3456)] * 3
    assert [tuple(w.shape) for w in net.W] == [(3456, 512)] * 3
    assert all(float(b.detach().abs().max()) == 0.0 for b in net.bias)
    std = (2.0 / (3456 + 512)) ** 0.5
    assert abs(float(net.V[0].detach().std()) - std) < 0.02 * std
    assert DCNInteraction(DCNConfig(), num_sparse=26, dim=128, dense_dim=128).out_features == 3456


def test_errors():
    with pytest.raises(ValueError, match="positive"):
        LowRankCrossNet(4, num_layers=0)
    with pytest.raises(ValueError, match="layers"):
        DCNConfig(layers=0)
    with pytest.raises(ValueError, match="dense arch's output width"):
        DCNInteraction(DCNConfig(), num_sparse=2, dim=3, dense_dim=4)
    arch = DCNInteraction(DCNConfig(layers=1, low_rank=2), num_sparse=2, dim=3, dense_dim=3)
    with pytest.raises(ValueError, match="dense must be"):
        arch(torch.zeros(2, 4), torch.zeros(2, 2, 3))
    with pytest.raises(ValueError, match="emb"):
        arch(torch.zeros(2, 3), torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="x0 must be"):
        arch.crossnet(torch.zeros(2, 5))
