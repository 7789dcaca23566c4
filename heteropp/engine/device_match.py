"""A host's chip type told by the name its accelerator reports: the cluster spec's `device_name` patterns
(shell patterns, case-insensitive) against the host's device name. Two types of one vendor with nodes of one
size (an A100 type and an H100 type of 8-GPU nodes) are alike in process count and vendor; without the host
saying its type (HETEROPP_CHIP) only the name its device reports tells them apart. What a host reports is data
matched against the patterns, never trusted beyond that."""
from __future__ import annotations

import fnmatch
from typing import Mapping, Sequence

MAX_NAME = 200  # characters of a reported device name kept (a longer one is cut)


def host_device_name(vendor: str) -> str | None:
    """The name this host's device 0 of ditorch vendor `vendor` reports (the one node_gather.host_vendor chose;
    torch.<device type>.get_device_name; on a CPU host, the processor's model name); None where it reports none."""
    from ditorch.registry import VendorError, adapter_for  # never at import: the fork server loads this

    try:
        adapter = adapter_for(vendor)
    except VendorError:
        return None
    if adapter.device_type == "cpu":
        return _cpu_model_name()
    import torch

    get = getattr(getattr(torch, adapter.device_type, None), "get_device_name", None)
    try:
        name = get(0) if callable(get) else None
    except Exception:  # a vendor module that cannot answer: no name, the other rules still apply
        return None
    return name[:MAX_NAME] if isinstance(name, str) and name.strip() else None


def _cpu_model_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()[:MAX_NAME]
    except OSError:
        pass
    import platform
    return platform.processor()[:MAX_NAME] or None


def name_matches(pattern: str | None, name: str | None) -> bool:
    """Whether a device reporting `name` fits a chip type whose spec gives `pattern` (False where either is
    missing)."""
    return pattern is not None and name is not None and fnmatch.fnmatchcase(name.lower(), pattern.lower())


def types_by_name(patterns: Mapping[str, str], name: str | None, among: Sequence[str]) -> list[str]:
    """The chip types of `among` whose pattern the device name fits."""
    return [t for t in among if name_matches(patterns.get(t), name)]
