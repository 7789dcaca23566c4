"""The heteropp runs `make test` leaves to `make test-long`, which sets HETEROPP_LONG_TESTS=1: each takes a
minute or more on 2 cores, or is judged on measured times. Each marked test is named in the Makefile's
LONG_TESTS (test_long_tests_listed.py checks it), so none is left out of every target."""
from __future__ import annotations

import os

import pytest

ENV = "HETEROPP_LONG_TESTS"


def long_test(why: str) -> pytest.MarkDecorator:
    """Skips the test unless HETEROPP_LONG_TESTS=1; `why`: what keeps it out of `make test`."""
    return pytest.mark.skipif(os.environ.get(ENV) != "1", reason=f"{why}: {ENV}=1 (make test-long)")
