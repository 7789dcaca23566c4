"""Checked values for the command lines and PRECISION_* variables: each check returns the value or
raises ValueError saying what was wrong and what was expected. ``cli_type`` makes one an argparse
type, so a bad option ends in argparse's usage message and exit status 2."""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable, TypeVar

T = TypeVar("T")


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r}: expected a finite number >= 0")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0; '1e9' is accepted for sizes."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{text!r}: expected a whole number >= 0")
    return int(value)


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise ValueError(f"{text!r}: expected a whole number >= 1")
    return value


def on_off(text: str) -> bool:
    """An on/off setting: 1/true/yes/on or 0/false/no/off (any other word is a typo, not "off")."""
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r}: expected 1/true/yes/on or 0/false/no/off")


def floating_dtype(text: str):
    """A floating torch dtype by name ('float64', 'torch.bfloat16')."""
    import torch

    dtype = getattr(torch, str(text).strip().removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{text!r} is not a floating torch dtype (e.g. float64, float32, bfloat16)")
    return dtype


def device(text: str):
    """A device this process can use: 'cpu', an accelerator type that is present, or ditorch's
    unified name 'device' ('device:1'): the accelerator ditorch chose."""
    import torch

    name, _, index = str(text).partition(":")
    if name == "device":
        if index and not index.isdigit():
            raise ValueError(f"{text!r}: expected 'device' or 'device:<index>'")
        try:
            import ditorch  # makes the name usable, as it does for the program that was captured
        except ImportError:
            raise ValueError(f"{text!r}: the unified device name needs ditorch, which is not installed") from None
        try:
            return ditorch.device_obj(int(index) if index else None)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"{text!r}: {str(exc).splitlines()[0]}") from None
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{text!r} is not a device ({str(exc).splitlines()[0]}); expected e.g. cpu, cuda:0") from None
    if dev.type in ("cpu", "meta"):
        return dev
    module = getattr(torch, dev.type, None)
    available = getattr(module, "is_available", None)
    if available is None or not available():
        raise ValueError(f"{text!r}: no {dev.type} device is available in this process")
    count = getattr(module, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"{text!r}: there are {count} {dev.type} devices")
    return dev


def output_file(text: str) -> str:
    """A file to write: not a directory, in a directory that exists."""
    if os.path.isdir(text):
        raise ValueError(f"{text!r} is a directory; expected a file name")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise ValueError(f"{text!r}: directory {parent!r} does not exist")
    return text


def cli_type(check: Callable[[str], T]) -> Callable[[str], T]:
    """``check`` as an argparse type: its message is kept in argparse's error."""

    def convert(text: str) -> T:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__.replace("_", " ")
    return convert
