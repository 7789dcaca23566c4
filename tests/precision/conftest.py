import pytest
import torch


@pytest.fixture
def one_thread():
    # Python dispatch modes and intra-op threads contend on a small shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
