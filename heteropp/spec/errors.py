"""The one error type of the spec loader: it names the file, the field, what was wrong and what was expected."""
from __future__ import annotations


class SpecError(ValueError):
    """A cluster, model, training, profile or plan input that cannot be used."""

    def __init__(self, source: str, field: str, problem: str, expected: str = "") -> None:
        self.source, self.field, self.problem, self.expected = source, field, problem, expected
        msg = f"{source}: field '{field}': {problem}"
        if expected:
            msg += f" (expected {expected})"
        super().__init__(msg)


class InfeasibleError(RuntimeError):
    """The inputs are well formed but no plan exists; the message says why."""
