"""argparse types shared by the `heteropp` and `heteroauto` command lines (argparse turns their errors into a
usage message and exit 2)."""
from __future__ import annotations

import argparse
import math
from typing import Callable


def at_least(least: int) -> Callable[[str], int]:
    """Integers >= `least`."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {v}")
        return v
    return parse


def greater_than(bound: float) -> Callable[[str], float]:
    """Finite numbers > `bound`."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > bound):
            raise argparse.ArgumentTypeError(f"expected a finite number > {bound:g}, got {text!r}")
        return v
    return parse


positive = greater_than(0)  # seconds, norms
above_one = greater_than(1)  # ratios that mean "slower than"
