"""The DIOPI benchmarks refuse counts they cannot run with a usage error (exit 2), not a traceback."""
from __future__ import annotations

import pytest

from bench import diopi_overhead, diopi_train


@pytest.mark.parametrize("main, argv, message", [
    (diopi_overhead.main, ["--calls", "4"], "--calls >= 5"),
    (diopi_overhead.main, ["--rounds", "0"], "--rounds must be >= 1"),
    (diopi_train.main, ["--steps", "0"], "--steps must be >= 1"),
    (diopi_train.main, ["--layers", "0"], "--layers and --steps must be >= 1"),
])
def test_counts_below_one_run_are_usage_errors(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unknown_backend_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        diopi_train.main(["--backends", "python,cuda"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--backends takes a comma-separated subset of python, native, diopi, got 'python,cuda'" in err
