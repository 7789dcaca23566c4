"""A stats capture through the C++ observer writes its index lines on a thread of its own, from
binary records the training thread keeps: every line must still say what the Python hook's line
for the same op says (the Python hook, which builds each line with json in the training thread, is
the reference), also when the writer's queue is full and the hand-over waits, and a write to a
place that cannot be written is an error, not a capture with lines missing."""
import json
import os

import pytest
import torch

from ditorch_precision import Capture, native, native_hook

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 12)
        self.norm = torch.nn.LayerNorm(12, eps=1e-3)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.lin(x), approximate="tanh"))


def _program(cap, model, x) -> None:
    """Ops whose arguments cover each kind the index writes: tensors, tensor lists, lists with
    None, ints, floats (inf, a wrapped number), bools, strings, dtypes, layouts, seeded randomness."""
    for _ in range(3):
        y = model(x)
        z = (y * 2.5).softmax(-1).sum(dim=[0], keepdim=True)
        w = torch.cat([z, z.flip(1)], 1).clamp(min=float("-inf"), max=3.0)
        idx = torch.tensor([0, 2])
        w[:, idx].to(torch.float64).mean()
        torch.zeros(2, 3, dtype=torch.int32, layout=torch.strided).add_(1)
        torch.rand(3, generator=torch.Generator().manual_seed(1))
        q = y.reshape(1, 3, 2, 6).transpose(1, 2)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.0)  # seeded, draws nothing
        y.reshape(3, -1).t().contiguous().div(7, rounding_mode="floor")
        cap.step()


def _lines(path: str) -> list[dict]:
    with open(os.path.join(path, "index.jsonl")) as f:
        return [json.loads(line) for line in f]


def _capture(path: str, hook: str) -> list[dict]:
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(3, 6)
    with torch.no_grad(), Capture(path, mode="stats", hook=hook) as cap:
        _program(cap, model, x)
    assert cap.hook_used == hook
    return _lines(path)


@pytest.mark.parametrize("max_queued", [native_hook.MAX_QUEUED, 1])
def test_the_index_lines_written_off_the_training_thread_say_what_the_python_hook_says(
        tmp_path, monkeypatch, max_queued):
    monkeypatch.setattr(native_hook, "MAX_QUEUED", max_queued)  # 1: every step waits for the writer's queue
    cpp = _capture(str(tmp_path / "cpp"), "cpp")
    python = _capture(str(tmp_path / "python"), "python")
    assert len(cpp) > 60 and len(cpp) == len(python)
    for a, b in zip(cpp, python):
        assert a == b
    assert {r["step"] for r in cpp} == {0, 1, 2}
    assert any(r.get("kind") == "module" for r in cpp)
    assert any(r.get("random") is True for r in cpp) and any(r.get("random") is False for r in cpp)
    meta = json.load(open(tmp_path / "cpp" / "meta.json"))
    assert meta["n_records"] == len(cpp) and meta["hook"] == "cpp"


def test_an_index_that_cannot_be_written_is_an_error(tmp_path):
    obs = native.op_observer()
    with pytest.raises(RuntimeError, match="cannot open for writing"):
        obs.open_index(str(tmp_path / "no" / "such" / "dir" / "index.jsonl"), 16)
    full = "/dev/full"
    if not os.path.exists(full):
        pytest.skip("no /dev/full to write to")
    obs.open_index(full, 16)
    obs.start()
    try:
        torch.ones(3).add(1)
    finally:
        obs.stop()
    with pytest.raises(RuntimeError, match="write failed"):
        obs.close_index()
