"""The backend is registered by `import dicomm` and by torch's autoload entry point.

A fresh interpreter stands in for a user's training script: it imports only torch and asks for
backend="dicomm"; with autoload disabled the same script must fail, which shows the registration
came from the entry point.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import sys, datetime
    import torch
    import torch.distributed as dist
    store = dist.HashStore()
    dist.init_process_group(backend="dicomm", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    t = torch.arange(4.0)
    back = torch.empty(4)
    works = [dist.isend(t, 0, tag=3), dist.irecv(back, 0, tag=3)]
    for w in works:
        w.wait()
    assert torch.equal(back, t), back
    print(dist.get_backend(), type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__)
    dist.destroy_process_group()
""")


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=120, env=env)


def test_plain_import_torch_finds_the_backend_through_autoload():
    proc = _run({})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["dicomm", "DicommBackend"]


def test_without_autoload_the_backend_is_unknown():
    proc = _run({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode != 0
    assert "dicomm" in proc.stderr.lower()


def test_import_dicomm_registers_and_the_entry_point_never_raises(monkeypatch):
    import torch.distributed as dist

    import dicomm
    from dicomm import _autoload
    assert "DICOMM" in dist.Backend._plugins
    assert dist.Backend.DICOMM == dicomm.BACKEND_NAME
    monkeypatch.setitem(sys.modules, "dicomm.backend", None)  # makes the import fail
    with pytest.raises(ImportError):
        import dicomm.backend  # noqa: F401
    _autoload.register()  # swallows it


def test_without_the_torch_extension_import_torch_still_works_and_says_why():
    script = ("import sys, warnings\n"
              "sys.modules['dicomm._C_torch'] = None  # as if built against another torch\n"
              "with warnings.catch_warnings(record=True) as w:\n"
              "    warnings.simplefilter('always')\n"
              "    import torch, torch.distributed as dist\n"
              "print('DICOMM' in dist.Backend._plugins, any('backend is unavailable' in str(x.message)"
              " for x in w))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"], proc.stdout + proc.stderr
