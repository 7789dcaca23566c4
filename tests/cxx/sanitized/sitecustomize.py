"""Loads dicomm._C from the file named by DICOMM_SANITIZED_MODULE, and ditorch_precision._C from the
one named by PRECISION_SANITIZED_MODULE (sanitizer builds), instead of the installed ones, in every
process that has this folder on PYTHONPATH (test ranks included).

Python imports sitecustomize after the site-packages .pth files, so this finder goes in front of
the editable install's own.
"""
from __future__ import annotations

import importlib.util
import os
import sys


class _SanitizedModule:
    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path

    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ARG002
        if name != self.name:
            return None
        return importlib.util.spec_from_file_location(name, self.path)


for _name, _var in (("dicomm._C", "DICOMM_SANITIZED_MODULE"), ("ditorch_precision._C", "PRECISION_SANITIZED_MODULE")):
    _path = os.environ.get(_var)
    if _path:
        if not os.path.isfile(_path):
            raise ImportError(f"{_var}={_path}: no such module file")
        sys.meta_path.insert(0, _SanitizedModule(_name, _path))
