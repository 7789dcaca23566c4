"""The ditorch tests' fixtures: each test leaves the shim exactly as it found it."""
from __future__ import annotations

import pytest
from ditorch_testutil import restore_state, save_state

import ditorch


@pytest.fixture
def plain():
    """Plain torch: ditorch off for the test, previous state back afterwards."""
    saved = save_state()
    ditorch.disable()
    yield ditorch
    restore_state(saved)


@pytest.fixture(params=["patch", "mode"])
def shim(plain, request):
    """The unified device name on, with each interception strategy (the vendor chosen here: CPU
    on a machine without accelerators)."""
    ditorch.enable(strategy=request.param)
    assert ditorch.active_strategy() == request.param
    yield ditorch


@pytest.fixture
def compat(shim):
    """CUDA compatibility on top of the shim."""
    ditorch.enable_cuda_compat()
    yield ditorch
