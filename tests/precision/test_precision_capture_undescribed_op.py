"""An op the C++ observer cannot describe (a nested tensor has no sizes) is an error of the capture
naming the op, not a record silently lost; and the ops after it are recorded, each once, as the
program calls them: torch catches a callback's exception and goes on, so the observer must leave its
per-thread state as it found it. CPU tensors."""
import json
import os

import pytest
import torch

from ditorch_precision import Capture, native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")


def _after() -> None:
    with torch.inference_mode():  # autograd's keys excluded at the top: tells a top-level op from an inner one
        torch.ones(3).sub(1)
    torch.ones(3).div(2)


def _ops(path: str) -> list[str]:
    with open(os.path.join(path, "index.jsonl")) as f:
        return [json.loads(line)["op"] for line in f]


def test_an_op_on_a_nested_tensor_is_an_error_naming_it_and_the_ops_after_it_are_recorded(tmp_path):
    called = ["aten::ones", "aten::sub", "aten::ones", "aten::div"]  # what _after calls, in order
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(RuntimeError, match=r"aten::mul\.Tensor could not be recorded .*NestedTensorImpl"):
        with Capture(str(tmp_path / "cpp"), mode="stats", hook="cpp"):
            nested.mul(2)
            _after()
    # (leaving inference mode records a copy of its own: not these ops, not compared)
    assert [op for op in _ops(str(tmp_path / "cpp")) if op in called] == called
