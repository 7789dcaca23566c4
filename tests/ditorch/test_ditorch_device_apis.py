"""The unified device name in the torch APIs a new user reaches for after factories and ``.to``:
torch.load(map_location), set_default_device, Generator, get_device_module, autocast, HuggingFace
from_pretrained(device_map); the bf16 check of HF's Trainer in CUDA-compatibility mode; device indices
out of range. On a machine without accelerators CPU tensors stand in for device tensors (the CPU adapter);
references are computed by plain torch on the real device with every mode off."""
from __future__ import annotations

import io

import pytest
import torch

import ditorch
from ditorch_testutil import placed


def reference(fn):
    with torch._C.DisableTorchFunction():
        return fn()


@pytest.mark.parametrize("location", ["device", "device:0", torch.device("cpu"), {"cpu": "device"}])
def test_torch_load_map_location(shim, location):
    buf = io.BytesIO()
    saved = {"w": torch.arange(6.0).reshape(2, 3)}
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location=location, weights_only=True)
    want = torch.device("cpu") if isinstance(location, torch.device) else placed()  # "cpu" is the CPU anywhere
    assert loaded["w"].device == want and torch.equal(loaded["w"].cpu(), saved["w"])
    buf.seek(0)
    assert torch.equal(torch.load(buf, location, weights_only=True)["w"].cpu(), saved["w"])  # positional


def test_torch_load_map_location_refused_without_the_shim(plain):
    buf = io.BytesIO()
    torch.save(torch.ones(1), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="device"):
        torch.load(buf, map_location="device", weights_only=True)


def test_set_default_device(shim):
    torch.set_default_device("device")
    try:
        x = torch.zeros(2)
        assert x.device == placed() and torch.get_default_device().type == placed().type
    finally:
        torch.set_default_device(None)


def test_generator(shim):
    g = torch.Generator(device="device").manual_seed(3)
    real = ditorch.device_obj()
    want = reference(lambda: torch.randn(4, generator=torch.Generator(real).manual_seed(3), device=real))
    assert g.device.type == real.type
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert torch.equal(torch.randn(4, generator=g, device="device"), want)
    assert torch.Generator().device.type == "cpu"  # no argument: as torch


def test_get_device_module(shim):
    assert torch.get_device_module("device") is torch.get_device_module(ditorch.device.type)
    assert torch.get_device_module(device="device:0") is torch.get_device_module(ditorch.device.type)


@pytest.mark.parametrize("spelling", ["positional", "keyword", "amp"])
def test_autocast(shim, spelling):
    a, b = torch.randn(4, 4, device="device"), torch.randn(4, 4, device="device")
    ctx = {"positional": lambda: torch.autocast("device", dtype=torch.bfloat16),
           "keyword": lambda: torch.autocast(device_type="device", dtype=torch.bfloat16),
           "amp": lambda: torch.amp.autocast("device", dtype=torch.bfloat16)}[spelling]()
    with ctx:
        got = a @ b
    with reference(lambda: torch.autocast(ditorch.device.autocast_device_type, dtype=torch.bfloat16)):
        want = reference(lambda: a @ b)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert isinstance(ctx, torch.amp.autocast_mode.autocast)


def test_device_apis_restored_exactly_by_disable(shim):
    ditorch.disable()
    for name in ("load", "set_default_device", "get_device_module", "Generator", "autocast"):
        assert getattr(torch, name).__module__.startswith("torch"), name
    assert torch.Generator is torch._C.Generator
    assert torch.autocast is torch.amp.autocast_mode.autocast is torch.amp.autocast
    assert "__init__" in vars(torch.autocast) and torch.autocast.__init__.__module__ == "torch.amp.autocast_mode"


@pytest.mark.parametrize("device_type", ["cpu", "device"])
def test_autocast_inside_torch_compile(shim, device_type):
    """torch.compile recognises torch.autocast by identity: the class must stay torch's own."""
    def fn(a, b):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return a @ b

    a, b = torch.randn(4, 4, device=device_type), torch.randn(4, 4, device=device_type)
    got = torch.compile(fn, backend="eager", fullgraph=True)(a, b)
    assert got.dtype == torch.bfloat16


@pytest.mark.parametrize("past", [0, 6])
def test_device_index_out_of_range_is_an_error(shim, past):
    n = torch.get_device_module(ditorch.device.type).device_count()
    spelling = f"device:{n + past}"
    expected = (rf"device index {n + past} is out of range: this host has {n} {ditorch.device.type} devices? "
                rf"\(indices 0 to {n - 1}\)")
    with pytest.raises(ValueError, match=expected):
        torch.zeros(1, device=spelling)
    with pytest.raises(ValueError, match="out of range"):
        torch.ones(1).to(spelling)


def test_cuda_index_out_of_range_in_compat_mode(compat):
    with pytest.raises(ValueError, match="device index 1 is out of range"):
        torch.zeros(1, device="cuda:1")


def test_is_bf16_supported_in_compat_mode_answers_for_the_vendor(compat):
    want = reference(lambda: float((torch.ones(2, dtype=torch.bfloat16) * 2).sum()) == 4.0)
    assert torch.cuda.is_bf16_supported() is want


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random-weight LLaMA saved here (nothing is downloaded), its input and plain torch's logits."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        return path, ids, model(ids).logits


class TestHuggingFace:

    @pytest.mark.parametrize("device_map", [{"": "device"}, "device", {"": "device:0"}])
    def test_from_pretrained_device_map(self, shim, checkpoint, device_map):
        from transformers import LlamaForCausalLM

        path, ids, want = checkpoint
        model = LlamaForCausalLM.from_pretrained(path, device_map=device_map)
        assert {p.device for p in model.parameters()} == {placed()}
        with torch.no_grad():
            torch.testing.assert_close(model(ids.to("device")).logits.cpu(), want)

    def test_training_arguments_bf16_in_compat_mode(self, compat, tmp_path):
        pytest.importorskip("transformers")
        from transformers import TrainingArguments

        args = TrainingArguments(output_dir=str(tmp_path), bf16=True, report_to=[])
        assert args.bf16


def test_default_device_context_still_sees_the_factories(shim):
    """``with torch.device("meta")`` (HuggingFace builds models under it) must still reach every factory."""
    with torch.device("meta"):
        made = [torch.arange(3), torch.zeros(2), torch.randn(2), torch.full((1,), 2.0), torch.tensor([1.0])]
    assert {t.device.type for t in made} == {"meta"}


def test_generator_inside_torch_compile(shim):
    def fn(x, g):
        noise = torch.randn(3, generator=torch.Generator().manual_seed(0))
        return x + noise if isinstance(g, torch.Generator) else x

    want = reference(lambda: torch.ones(3) + torch.randn(3, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(torch.compile(fn, backend="eager")(torch.ones(3), torch.Generator()), want)


@pytest.mark.parametrize("spelling", ["device", "device:0"])
def test_is_autocast_available_takes_the_device_name(shim, spelling):
    want = reference(lambda: torch.amp.is_autocast_available(ditorch.device.autocast_device_type))
    assert torch.amp.is_autocast_available(spelling) is want is True
    assert torch.amp.autocast_mode.is_autocast_available(spelling) is want
    assert torch.amp.is_autocast_available("cpu") is reference(lambda: torch.amp.is_autocast_available("cpu"))


def test_is_autocast_available_restored_by_disable(shim):
    ditorch.disable()
    assert torch.amp.is_autocast_available.__module__ == "torch.amp.autocast_mode"
    with pytest.raises(RuntimeError, match="device"):
        torch.amp.is_autocast_available("device")


@pytest.mark.filterwarnings("ignore:The argument 'device' of Tensor")
@pytest.mark.parametrize("spelling", ["positional", "keyword"])
def test_pin_memory_takes_the_device_name(shim, spelling):
    """On the CPU vendor the device's memory is the host's: pinning it for the device is the tensor
    itself, and it is not pinned; on an accelerator it is torch's pinning for that device."""
    x = torch.arange(4.0)
    pin = (lambda t: t.pin_memory("device")) if spelling == "positional" else (lambda t: t.pin_memory(device="device"))
    pinned = (lambda t: t.is_pinned("device")) if spelling == "positional" else (lambda t: t.is_pinned(device="device"))
    if ditorch.device.type == "cpu":
        assert pin(x) is x and pinned(x) is False
    else:
        want = reference(lambda: torch._C.TensorBase.pin_memory(x, ditorch.device.type))
        got = pin(x)
        assert torch.equal(got, want) and got.is_pinned() and pinned(got)
    with pytest.raises(RuntimeError, match="device"):
        reference(lambda: torch._C.TensorBase.pin_memory(x, "device"))  # plain torch does not know the name
