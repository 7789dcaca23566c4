"""Loads dicomm._C from the file named by DICOMM_SANITIZED_MODULE (a sanitizer build) instead of
the installed one, in every process that has this folder on PYTHONPATH (test ranks included).

Python imports sitecustomize after the site-packages .pth files, so this finder goes in front of
the editable install's own.
"""
from __future__ import annotations

import importlib.util
import os
import sys


class _SanitizedModule:
    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ARG002
        if name != "dicomm._C":
            return None
        return importlib.util.spec_from_file_location(name, self.path)


_path = os.environ.get("DICOMM_SANITIZED_MODULE")
if _path:
    if not os.path.isfile(_path):
        raise ImportError(f"DICOMM_SANITIZED_MODULE={_path}: no such module file")
    sys.meta_path.insert(0, _SanitizedModule(_path))
