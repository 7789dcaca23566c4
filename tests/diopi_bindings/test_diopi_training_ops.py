"""Which ATen operators a LLaMA-style training step with torch.optim.AdamW sends to the diopi device, and
where they run: nn.Linear with a bias (addmm), out= overloads named after their output
(nll_loss_forward.output, gelu_backward.grad_input, threshold_backward.grad_input), relu, AdamW's
lerp/addcdiv/addcmul/sqrt/div all run in the reference library: no operator falls back to the CPU, on
either device backend. The losses and parameters match the same step in plain CPU torch. Copies are
counted whoever makes them (.to(), .cpu(), .item(), the CPU fallback's)."""
from __future__ import annotations

import pytest
from diopi_testlib import run_python

# A small LLaMA-style model (RMSNorm, causal attention, gated MLP, biases on some projections), one MLP
# activation per block (silu, relu, gelu), cross-entropy, AdamW with weight decay; two steps on `dev`.
TRAIN = """
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F
from diopi_bindings import device
device.enable(None, backend=sys.argv[1])

class Block(nn.Module):
    def __init__(self, d, heads, act):
        super().__init__()
        self.heads, self.act = heads, act
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=True), nn.Linear(d, d, bias=False)
        self.up, self.gate, self.down = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.down(self.act(self.gate(y)) * self.up(y))

class LM(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, act) for act in (F.silu, F.relu, F.gelu))
        self.norm, self.head = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

def train(dev, dtype=torch.float32):
    torch.manual_seed(0)
    model = LM().to(dev, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(2):
        t = torch.randint(0, 64, (2, 9), generator=g).to(dev)
        loss = F.cross_entropy(model(t[:, :-1]).reshape(-1, 64), t[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu().double() for p in model.parameters()]

def error(params, exact):
    return float(torch.cat([(p - q).abs().reshape(-1) for p, q in zip(params, exact)]).mean())

_, exact = train("cpu", torch.float64)
cpu_losses, cpu_params = train("cpu")
losses, params = train("diopi")
worst = [error(params, exact), error(cpu_params, exact)]
print(json.dumps({"cpu": cpu_losses, "dev": losses, "worst": worst, "routed": dict(device.routed_ops()),
                  "fallbacks": dict(device.fallback_ops())}))
"""


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_llama_step_with_adamw_runs_every_operator_in_the_library(backend, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    got = run_python(f"import sys, runpy; sys.argv = ['train', {backend!r}]; runpy.run_path({str(script)!r})")
    assert got["fallbacks"] == {}, f"on the CPU: {got['fallbacks']}"
    assert got["dev"] == pytest.approx(got["cpu"], rel=1e-5)
    # the parameters after two AdamW steps against the same steps in float64 on the CPU: no further off
    # than plain CPU torch's float32 (a near-cancelling gradient differs between any two float32
    # computations, and Adam's normalised step of a tiny gradient follows it)
    device_error, cpu_error = got["worst"]
    assert device_error <= 2 * cpu_error + 1e-7, got["worst"]
    routed = set(got["routed"])
    # before: addmm, the out= overloads named after their output, lerp, addcdiv, relu's backward and
    # (host-memory device) stack fell back to the CPU
    expected = ({"aten::addmm.out", "aten::nll_loss_forward.output", "aten::nll_loss_backward.grad_input",
                 "aten::gelu_backward.grad_input", "aten::threshold_backward.grad_input", "aten::lerp.Scalar_out",
                 "aten::addcdiv.out", "aten::addcmul.out", "aten::sqrt.out", "aten::bmm.out", "aten::cat.out"}
                if backend == "native" else
                {"aten::addmm", "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::gelu_backward",
                 "aten::threshold_backward", "aten::lerp_.Scalar", "aten::addcdiv_", "aten::addcmul_",
                 "aten::sqrt", "aten::bmm", "aten::cat"})  # stack: cat of unsqueezed views
    assert expected - routed == set()


def test_copies_are_counted_whoever_makes_them():
    got = run_python("""
        import json, torch
        from diopi_bindings import device
        device.enable(None, backend="native")

        def delta(fn):
            before = device.copy_ops()
            fn()
            after = device.copy_ops()
            return {k: after[k] - before[k] for k in after if after[k] != before[k]}

        x = torch.randn(4, 5)
        d = x.to("diopi")
        out = {"to": delta(lambda: x.to("diopi")), "cpu": delta(lambda: d.cpu()),
               "item": delta(lambda: d.sum().item()),
               "fallback": delta(lambda: torch.cumsum(d, 0))}  # cumsum: not in the library
        out["fallbacks"] = dict(device.fallback_ops())
        print(json.dumps(out))
    """)
    assert got["to"] == {"host to device": 1}
    assert got["cpu"] == {"device to host": 1}
    assert got["item"] == {"device to host (item)": 1}
    assert "aten::cumsum.out" in got["fallbacks"] or "aten::cumsum" in got["fallbacks"]
    assert got["fallback"]["fallback to host"] >= 1 and got["fallback"]["device to host"] >= 1
    assert got["fallback"]["host to device"] >= 1  # the result, or the out= written back
