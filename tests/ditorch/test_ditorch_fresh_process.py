"""What needs a fresh interpreter: the paper's snippet exactly as written, import-time errors, and
the state of torch before ditorch was ever imported (captured by the child before its import)."""
from __future__ import annotations

import json

import pytest

from ditorch_testutil import run_python

PAPER_SNIPPET = """
import torch
import ditorch
x = torch.randn(4, 4, device="device")
y = x + x
"""


def test_paper_snippet_runs_as_written():
    check = "\nprint('RESULT', y.device.type == ditorch.device.type, torch.equal(y, x * 2), tuple(y.shape))\n"
    proc = run_python(PAPER_SNIPPET + check)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT True True (4, 4)" in proc.stdout


def test_unknown_vendor_fails_at_import_with_the_available_list():
    proc = run_python("import torch\nimport ditorch\n", env={"DITORCH_VENDOR": "tpu"})
    assert proc.returncode != 0
    assert "VendorError: DITORCH_VENDOR='tpu' names no known vendor" in proc.stderr
    assert "available here:" in proc.stderr and "cpu" in proc.stderr.split("available here:")[1]


CUDA_SCRIPT_AND_SNAPSHOT = """
import json, torch
def snapshot():
    return {name: {k: id(v) for k, v in vars(obj).items()} for name, obj in
            {"torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor,
             "torch.nn.Module": torch.nn.Module, "torch.device": torch.device, "torch._C._nn": torch._C._nn,
             "torch._C.TensorBase": torch._C.TensorBase}.items()}
if torch.cuda.is_available():  # CUDA's lazy initialisation changes torch.cuda by itself: done before the snapshot
    torch.nn.Linear(4, 1).cuda()(torch.randn(2, 4, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.device_count()  # cached by torch on first call
before = snapshot()
keep = [getattr(torch.cuda, k) for k in vars(torch.cuda)]  # keep ids unique while we compare
stack_before = torch._C._len_torch_function_stack()
import ditorch  # DITORCH_CUDA_COMPAT=1: routes CUDA spellings on import
assert ditorch.cuda_compat_enabled()
model = torch.nn.Linear(4, 1).cuda()
loss = model(torch.randn(2, 4, device="cuda")).sum()
loss.backward()
torch.cuda.synchronize()
ran = torch.cuda.is_available() and model.weight.grad is not None
ditorch.disable()
after = snapshot()
diff = {name: sorted(k for k in set(before[name]) | set(after[name]) if before[name].get(k) != after[name].get(k))
        for name in before}
print("RESULT", json.dumps({"ran": ran, "diff": diff, "stack": [stack_before, torch._C._len_torch_function_stack()]}))
"""


def test_disable_leaves_no_patch_behind_compared_with_torch_before_import():
    proc = run_python(CUDA_SCRIPT_AND_SNAPSHOT, env={"DITORCH_CUDA_COMPAT": "1"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["ran"] is True
    # torch.cuda gains nothing and loses nothing; other objects are never touched.
    assert all(changed == [] for changed in result["diff"].values()), result["diff"]
    assert len(result["diff"]) == 7
    assert result["stack"] == [0, 0]


@pytest.mark.parametrize("value, enabled", [("false", False), ("Off", False), ("yes", True)])
def test_enable_variable_parsed_as_a_boolean(value, enabled):
    done = run_python("import ditorch; print(ditorch.is_enabled())", env={"DITORCH_ENABLE": value})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(enabled)


@pytest.mark.parametrize("value, on", [("no", False), ("", False), ("on", True)])
def test_cuda_compat_variable_parsed_as_a_boolean(value, on):
    done = run_python("import ditorch; print(ditorch.cuda_compat_enabled())", env={"DITORCH_CUDA_COMPAT": value})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(on)


@pytest.mark.parametrize("name", ["DITORCH_ENABLE", "DITORCH_CUDA_COMPAT"])
def test_unrecognised_boolean_is_a_clear_error(name):
    done = run_python("import ditorch", env={name: "maybe"})
    assert done.returncode != 0
    assert f"{name}='maybe' is not a boolean: use one of 1/true/yes/on or 0/false/no/off" in done.stderr
