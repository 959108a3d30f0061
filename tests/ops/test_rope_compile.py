"""torch.compile(fullgraph=True) traces a model that calls apply_rope (custom op: no graph break)."""

from __future__ import annotations

import torch

import fuselab
from fuselab.testing import assert_close


class TinyAttentionInput(torch.nn.Module):
    """Projects x to q and k (GQA 4/2 heads), rotates both with fuselab, returns a scalar-friendly product."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2, head_dim: int = 8, seqlen: int = 6):
        super().__init__()
        self.q = torch.nn.Linear(dim, heads * head_dim)
        self.k = torch.nn.Linear(dim, kv_heads * head_dim)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        cos, sin = fuselab.rope_cos_sin(seqlen, head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim)
        q, k = fuselab.apply_rope(q, k, self.cos, self.sin)
        return (q.reshape(b, s, -1) * k.repeat_interleave(2, dim=2).reshape(b, s, -1)).sum(-1)


def test_compile_fullgraph(triton_backend, device):
    model = TinyAttentionInput().to(device)
    x = torch.randn(2, 6, 32, device=device)
    eager_out = model(x)
    eager_out.sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    assert_close(out, eager_out.double(), torch.float32, "compiled forward")
    for g, want in zip((p.grad for p in model.parameters()), eager_grads):
        assert_close(g, want.double(), torch.float32, "compiled grad", chained=True)
    # no-grad inference under compile goes through the custom op too
    with torch.no_grad():
        assert_close(compiled(x), eager_out.double(), torch.float32, "compiled no-grad forward", chained=True)
