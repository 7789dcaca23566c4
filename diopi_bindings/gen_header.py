"""Generate ``include/diopi/functions.h`` from the operator schema.

``python -m diopi_bindings.gen_header`` rewrites the header; ``--check`` exits 1 if the committed
header differs from what the schema generates (the build and the tests use that).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diopi_bindings.schema import OPS, OpSchema

HEADER = Path(__file__).resolve().parent / "include" / "diopi" / "functions.h"

_C_TYPES = {
    "out": "diopiTensorHandle_t",
    "out?": "diopiTensorHandle_t",
    "inout": "diopiTensorHandle_t",
    "out*": "diopiTensorHandle_t*",  # the kernel stores the handle ctx->require_tensor gave it
    "in": "diopiConstTensorHandle_t",
    "in?": "diopiConstTensorHandle_t",
    "in[]": "diopiTensorList_t",
    "in?[]": "diopiTensorList_t",  # entries may be NULL
    "double": "double",
    "int": "int64_t",
    "bool": "bool",
    "ints": "diopiSize_t",
}


def c_prototype(op: OpSchema) -> str:
    params = ["diopiContextHandle_t ctx"] + [f"{_C_TYPES[a.kind]} {a.name}" for a in op.args]
    return f"DIOPI_API DIOPI_WEAK diopiError_t {op.symbol}({', '.join(params)});"


def render() -> str:
    lines = [
        "/* Generated from diopi_bindings/schema.py by `python -m diopi_bindings.gen_header`: do not edit. */",
        "#ifndef DIOPI_FUNCTIONS_H_",
        "#define DIOPI_FUNCTIONS_H_",
        "",
        '#include "diopirt.h"',
        "",
        "/* Weak: a library defines any subset; the framework looks each one up when it loads the library",
        " * and serves the rest itself. Optional tensors (in?, out?) may be NULL. An out* output's size depends",
        " * on the data: the kernel allocates it through ctx->require_tensor and stores the handle there. */",
        "#if defined(_WIN32)",
        "#define DIOPI_WEAK",
        "#else",
        "#define DIOPI_WEAK __attribute__((weak))",
        "#endif",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
    ]
    for op in OPS:
        kinds = " ".join(f"{a.name}:{a.kind}" for a in op.args)
        lines.append(f"/* {op.aten} [{', '.join(op.dtypes)}] {kinds}" + (f"\n * {op.doc}" if op.doc else "") + " */")
        lines.append(c_prototype(op))
        lines.append("")
    lines += ["#ifdef __cplusplus", "}", "#endif", "", "#endif /* DIOPI_FUNCTIONS_H_ */", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the header is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not HEADER.exists() or HEADER.read_text() != text:
            print(f"{HEADER.name} is out of date: run python -m diopi_bindings.gen_header", file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
