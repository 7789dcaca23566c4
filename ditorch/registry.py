"""Which vendors exist, in which order they are tried, and which one this process uses.

Order: built-in accelerators (cuda, rocm, npu, mlu, musa, xpu, mps), then third-party adapters
from the ``ditorch.adapters`` entry-point group, then cpu; ``Adapter.priority`` sorts them.
``DITORCH_VENDOR=<name>`` (a name or alias) skips the search.
"""
from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from ditorch.adapter import Adapter
from ditorch.adapters import BUILTIN_MODULES

logger = logging.getLogger("ditorch")

ENTRY_POINT_GROUP = "ditorch.adapters"
VENDOR_ENV = "DITORCH_VENDOR"


class VendorError(RuntimeError):
    """A requested vendor is unknown or not usable in this process."""


def builtin_adapters() -> list[Adapter]:
    return [importlib.import_module(f"ditorch.adapters.{m}").ADAPTER for m in BUILTIN_MODULES]


def _load_entry_point(ep) -> Adapter:
    obj = ep.load()
    adapter = obj if isinstance(obj, Adapter) else obj()
    if not isinstance(adapter, Adapter):
        raise TypeError(f"expected a ditorch.adapter.Adapter or a callable returning one, got {type(adapter).__name__}")
    return adapter


def third_party_adapters() -> tuple[list[Adapter], dict[str, str]]:
    """Adapters registered under the ``ditorch.adapters`` entry-point group, and load failures."""
    builtin_names = {n for a in builtin_adapters() for n in a.names()}
    found: list[Adapter] = []
    failures: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            adapter = _load_entry_point(ep)
        except Exception as exc:  # one broken plug-in must not hide the others
            failures[ep.name] = f"entry point {ep.value!r} failed to load: {type(exc).__name__}: {exc}"
            logger.warning("skipping adapter %s: %s", ep.name, failures[ep.name])
            continue
        clash = builtin_names.intersection(adapter.names())
        if clash:
            failures[ep.name] = f"its names {sorted(clash)} clash with built-in adapters"
            logger.warning("skipping adapter %s: %s", ep.name, failures[ep.name])
            continue
        found.append(adapter)
    return found, failures


def all_adapters() -> list[Adapter]:
    """Every known adapter in selection order (CPU last)."""
    adapters = builtin_adapters() + third_party_adapters()[0]
    return sorted(adapters, key=lambda a: (a.priority, a.name))


def _find(name: str, adapters: list[Adapter]) -> Adapter | None:
    wanted = name.strip().lower()
    for adapter in adapters:
        if wanted in (n.lower() for n in adapter.names()):
            return adapter
    return None


def adapter_for(name: str) -> Adapter:
    """The adapter for a vendor or chip-type name (e.g. ``"npu"``, ``"ascend"``, ``"cuda"``).

    Does not require the chip to be present here: a pipeline planner asks this about remote chips.
    """
    adapters = all_adapters()
    adapter = _find(name, adapters)
    if adapter is None:
        known = ", ".join(f"{a.name} ({'/'.join(a.aliases)})" if a.aliases else a.name for a in adapters)
        raise VendorError(f"unknown vendor or chip type {name!r}; known: {known}")
    return adapter


def select(vendor: str | None = None) -> tuple[Adapter, str]:
    """The adapter this process should use and a one-line reason.

    ``vendor`` (normally from ``DITORCH_VENDOR``) must name a known, available vendor; without it
    the first available adapter in selection order wins.
    """
    adapters = all_adapters()
    reasons = {a.name: a.unavailable_reason() for a in adapters}
    available = [a.name for a in adapters if reasons[a.name] is None]
    if vendor:
        adapter = _find(vendor, adapters)
        if adapter is None:
            failures = third_party_adapters()[1]
            broken = f"; adapters that failed to load: {failures}" if failures else ""
            raise VendorError(
                f"{VENDOR_ENV}={vendor!r} names no known vendor; known vendors: "
                f"{', '.join(a.name for a in adapters)}; available here: {', '.join(available)}{broken}. "
                f"Set {VENDOR_ENV} to one of the available vendors or unset it."
            )
        if reasons[adapter.name] is not None:
            raise VendorError(
                f"{VENDOR_ENV}={vendor!r} ({adapter.description or adapter.name}) is not available here: "
                f"{reasons[adapter.name]}; available here: {', '.join(available)}. "
                f"Set {VENDOR_ENV} to one of them or unset it."
            )
        return adapter, f"{VENDOR_ENV}={vendor}"
    for adapter in adapters:
        if reasons[adapter.name] is None:
            skipped = "; ".join(f"{a.name}: {reasons[a.name]}" for a in adapters if a.priority < adapter.priority)
            why = f"first available in order {', '.join(a.name for a in adapters)}"
            return adapter, f"{why} (skipped {skipped})" if skipped else why
    raise VendorError(f"no adapter is available, not even cpu: {reasons}")  # cpu never fails
