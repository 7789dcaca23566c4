"""``DITORCH_VENDOR=diopi``: ``import ditorch`` puts the unified device name on the diopi device, in every
torch API that takes a device, and heteropp's tiny LLaMA trains through ``"device"`` like plain CPU
torch. One fresh interpreter per test (the device registers once per process)."""
from __future__ import annotations

import pytest
from diopi_testlib import run_python

APIS = """
    import io, json, torch, ditorch
    out = {"vendor": ditorch.device.vendor, "type": ditorch.device.type, "count": ditorch.device.count()}
    x = torch.randn(3, 4, device="device")
    out["factory"] = str(x.device)
    out["to"] = str(torch.ones(2).to("device").device)
    buf = io.BytesIO(); torch.save({"w": torch.arange(4.0)}, buf); buf.seek(0)
    loaded = torch.load(buf, map_location="device", weights_only=True)["w"]
    out["load"] = [str(loaded.device), loaded.cpu().tolist()]
    # a checkpoint saved on CUDA (its storages tagged "cuda:0" at save), remapped by a {source: target} dict
    torch.serialization.register_package(0, lambda s: "cuda:0" if s.device.type == "cpu" else None, lambda o, l: None)
    buf = io.BytesIO(); torch.save({"w": torch.arange(4.0)}, buf); buf.seek(0)
    torch.serialization._package_registry.pop(0)
    mapped = torch.load(buf, map_location={"cuda:0": "device"}, weights_only=True)["w"]
    out["load dict"] = [str(mapped.device), mapped.cpu().tolist()]
    torch.set_default_device("device"); out["default"] = str(torch.zeros(1).device); torch.set_default_device(None)
    out["module"] = torch.get_device_module("device") is torch.get_device_module("diopi")
    with torch.autocast("device", dtype=torch.bfloat16):
        out["autocast"] = str((x @ x.t()).dtype)
    for key, call in (("generator", lambda: torch.Generator(device="device")),
                      ("index", lambda: torch.zeros(1, device="device:1"))):
        try:
            call(); out[key] = "no error"
        except (RuntimeError, ValueError) as exc:
            out[key] = str(exc)
    print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["python", "native"])
def test_every_device_api_on_the_diopi_vendor(reference_path, backend):
    # One device, so that "device:1" must be refused (the reference library reports 2 by default).
    got = run_python(APIS, env={"DITORCH_VENDOR": "diopi", "DIOPI_LIBRARY": str(reference_path),
                                "DIOPI_DEVICE_BACKEND": backend, "DIOPI_REFERENCE_DEVICES": "1"})
    assert (got["vendor"], got["type"], got["count"]) == ("diopi", "diopi", 1)
    assert got["factory"] == got["to"] == got["default"] == "diopi:0"
    assert got["load"] == got["load dict"] == ["diopi:0", [0.0, 1.0, 2.0, 3.0]]
    assert got["module"] is True
    assert got["autocast"] == "torch.bfloat16"
    if backend == "python":
        assert "the 'diopi' device has no generator of its own" in got["generator"]
    else:
        assert got["generator"] == "no error"
    assert "device index 1 is out of range: this host has 1 diopi device" in got["index"]


def test_tiny_llama_through_the_unified_name(reference_path):
    got = run_python("""
        import json, torch, ditorch
        from bench.diopi_train import train_tiny
        from ditorch_precision.loss import loss_check
        torch.set_num_threads(1)
        ref, _ = train_tiny("cpu", steps=2, layers=1)
        got, _ = train_tiny("device", steps=2, layers=1)
        print(json.dumps({"passed": loss_check(got, ref).passed, "ref": ref, "got": got}))
    """, env={"DITORCH_VENDOR": "diopi", "DIOPI_LIBRARY": str(reference_path)})
    assert got["passed"], got


def test_huggingface_llama_from_pretrained_on_the_diopi_vendor(reference_path, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    got = run_python(f"""
        import json, torch
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        model.save_pretrained({str(tmp_path)!r})
        ids = torch.randint(0, 64, (1, 8))
        with torch.no_grad():
            want = model(ids).logits
        import ditorch
        loaded = LlamaForCausalLM.from_pretrained({str(tmp_path)!r}, device_map={{"": "device"}})
        with torch.no_grad():
            logits = loaded(ids.to("device")).logits.cpu()
        print(json.dumps({{"devices": sorted({{str(p.device) for p in loaded.parameters()}}),
                          "max_diff": float((logits - want).abs().max())}}))
    """, env={"DITORCH_VENDOR": "diopi", "DIOPI_LIBRARY": str(reference_path)})
    assert got["devices"] == ["diopi:0"]
    assert got["max_diff"] < 1e-5


def test_malformed_library_is_refused_by_import_ditorch(tmp_path):
    bogus = tmp_path / "libbogus.so"
    bogus.write_text("not a library")
    import subprocess
    import sys

    from diopi_testlib import REPO_ROOT

    done = subprocess.run([sys.executable, "-c", "import ditorch"], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "DITORCH_VENDOR": "diopi", "DIOPI_LIBRARY": str(bogus)})
    assert done.returncode != 0
    assert "DITORCH_VENDOR='diopi'" in done.stderr and "cannot load DIOPI library" in done.stderr


def test_use_vendor_after_enabling_the_device_in_code(reference_path):
    got = run_python(f"""
        import json, torch, ditorch
        from diopi_bindings import device
        before = ditorch.device.type
        device.enable({str(reference_path)!r})
        ditorch.use_vendor("dipu")
        print(json.dumps({{"before": before, "after": str(torch.ones(1, device="device").device)}}))
    """)
    assert got == {"before": "cpu", "after": "diopi:0", "_stderr": got["_stderr"]}
