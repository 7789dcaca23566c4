"""Suite-wide settings. `make test` runs the suite in two pytest-xdist workers: most tests wait on the processes
they start (ranks, CLIs, compilers) for a good part of their time, so two at once keep both cores busy. Tests
that hold one resource of the machine take its lock (tests/machine_lock.py) for as long as they run: their
files are named here, with the resource (fixtures that hold one longer take the lock themselves)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.machine_lock import machine_lock

# file (relative to tests/) -> the machine-wide resource its tests hold: network namespaces, veth links and
# addresses (some on fixed subnets, 10.227.0.0/24)
SHARED_RESOURCES = {
    "dicomm/test_engine_remote_listener.py": "netns",
    "heteropp/test_heteropp_two_clusters.py": "netns",
    "heteropp/test_heteropp_netns_link.py": "netns",
    "heteropp/test_heteropp_netns_sigterm.py": "netns",
}


def pytest_configure(config: pytest.Config) -> None:
    missing = sorted(f for f in SHARED_RESOURCES if not (config.rootpath / "tests" / f).is_file())
    if missing:  # a renamed file would run its tests without the lock
        raise pytest.UsageError(f"tests/conftest.py: SHARED_RESOURCES names {missing}, which do not exist "
                                "(expected test files under tests/)")


@pytest.fixture(autouse=True)
def _machine_resource(request: pytest.FixtureRequest) -> Iterator[None]:
    try:
        rel = request.node.path.relative_to(request.config.rootpath / "tests").as_posix()
    except ValueError:
        rel = ""
    if rel not in SHARED_RESOURCES:
        yield
        return
    with machine_lock(SHARED_RESOURCES[rel]):
        yield
