"""Generate the C++ routing table of ``_C_diopi`` from diopi_functions.yaml: ``python -m diopi_bindings.gen_dispatch``
(``--check`` exits 1 when the committed file differs).

Each entry becomes a trampoline that reads the ATen arguments from the boxed stack (csrc_diopi/frame.h),
converts each to the type of the DIOPI parameter it fills (read from include/deeplink/diopi/functions.h) and
calls the library's function through a pointer of the prototype's own type, so a table entry that does not fit
its prototype fails to compile. A functional overload's out= overloads are routed with the same call.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml

HERE = Path(__file__).resolve().parent
TABLE = HERE / "diopi_functions.yaml"
FUNCTIONS_H = HERE / "include" / "deeplink" / "diopi" / "functions.h"
OUTPUT = HERE / "csrc_diopi" / "dispatch_table.gen.cpp"

# DIOPI parameter type -> the Frame accessor that converts an ATen argument to it.
_CONVERT = {
    "diopiConstTensorHandle_t": "in",
    "diopiTensorHandle_t": "mut",
    "const diopiScalar_t*": "scalar",
    "int64_t": "i64",
    "double": "f64",
    "float": "f32",
    "bool": "boolean",
    "diopiSize_t": "size",
    "diopiConstTensorHandle_t*": "tensors",
    "diopiReduction_t": "reduction",
    "diopiGeneratorHandle_t": "generator",
}


class TableError(ValueError):
    pass


@dataclass(frozen=True)
class Route:
    aten: str          # overload name, "add.out"
    diopi: str         # function name
    arguments: tuple[str, ...]  # C++ expressions, in the prototype's order
    condition: str = ""  # C++ test the call needs, else the CPU serves it


def prototypes(text: str) -> dict[str, list[str]]:
    """DIOPI function name -> its parameter types, from functions.h."""
    found: dict[str, list[str]] = {}
    for name, params in re.findall(r"diopiError_t\s+(diopi\w+)\s*\(([^;]*?)\)\s*;", text, re.S):
        types = []
        for param in params.split(","):
            words = " ".join(param.split())
            types.append(re.sub(r"\s*\w+$", "", words).replace(" *", "*"))
        found[name] = types
    return found


def split_arguments(text: str) -> list[str]:
    """A call's arguments, split at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return parts + [current.strip()]


def _condition(entry: str, when: str, schema: torch._C.FunctionSchema) -> str:
    """``when: NAME == NUMBER``: the C++ test; a call that fails it runs on the CPU."""
    match = re.fullmatch(r"\s*(\w+)\s*==\s*(-?[\d.]+)\s*", when)
    names = [a.name for a in schema.arguments]
    if not match or match.group(1) not in names:
        raise TableError(f"{entry}: when: {when!r} is not NAME == NUMBER over its arguments")
    return f"f.number({names.index(match.group(1))}) == {match.group(2)}"


def _schema(overload: str) -> torch._C.FunctionSchema:
    name, _, variant = overload.partition(".")
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        if schema.overload_name == variant:
            return schema
    raise TableError(f"{overload}: no such ATen overload in torch {torch.__version__}")


def _out_variants(functional: torch._C.FunctionSchema) -> list[str]:
    """The out= overloads of a functional schema: the same inputs plus written keyword-only outputs."""
    inputs = [(a.name, str(a.type)) for a in functional.arguments]
    found = []
    for schema in torch._C._jit_get_schemas_for_operator(functional.name):
        outs = [a for a in schema.arguments if a.is_out]
        rest = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
        if outs and rest == inputs and len(outs) == len(functional.returns):
            found.append(f"{functional.name.split('::')[1]}.{schema.overload_name}")
    return found


def _arguments(entry: str, call_args: list[str], types: list[str], schema: torch._C.FunctionSchema) -> tuple[str, ...]:
    if len(call_args) != len(types):
        raise TableError(f"{entry}: {len(call_args)} arguments for {len(types)} parameters")
    names = [a.name for a in schema.arguments]
    out: list[str] = []
    for token, ctype in zip(call_args, types):
        if token == "ctx":
            out.append("f.ctx()")
        elif re.fullmatch(r"out\d*", token):  # a result (for an out= overload, its out argument)
            if ctype not in ("diopiTensorHandle_t", "diopiTensorHandle_t*"):
                raise TableError(f"{entry}: {token} fills a {ctype} parameter")
            # diopiTensorHandle_t*: the library allocates the result (diopiRequireTensor) and returns it there
            accessor = "out" if ctype == "diopiTensorHandle_t" else "allocated"
            out.append(f"f.{accessor}({int(token[3:] or 0)})")
        elif (number := re.fullmatch(r"scalar\((-?[\d.]+)\)", token)) and ctype == "const diopiScalar_t*":
            out.append(f"f.constant({float(number.group(1))!r})")
        elif (length := re.fullmatch(r"len\((\w+)\)", token)) and length.group(1) in names:
            out.append(f"f.count({names.index(length.group(1))})")
        elif (at := re.fullmatch(r"(len\()?at\((\w+),\s*(\w+)\)\)?", token)) and {*at.group(2, 3)} <= set(names):
            # at(index, dim): the index list [None] * dim + [index] (index_add as an accumulating index_put)
            index, dim = names.index(at.group(2)), names.index(at.group(3))
            out.append(f"f.at_count({dim})" if at.group(1) else f"f.at({index}, {dim})")
        elif token == "default_generator" and ctype == "diopiGeneratorHandle_t":
            out.append("f.default_generator()")
        elif token in names:
            accessor = _CONVERT.get(ctype)
            if accessor is None:
                raise TableError(f"{entry}: no conversion from an ATen argument to {ctype}")
            out.append(f"f.{accessor}({names.index(token)})")
        else:
            out.append(token)  # a literal
    return tuple(out)


def routes(table_text: str, functions_text: str) -> list[Route]:
    protos = prototypes(functions_text)
    found: list[Route] = []
    seen: set[str] = set()
    for item in yaml.safe_load(table_text):
        entry, call = item["aten"], item["diopi"]
        match = re.fullmatch(r"\s*(diopi\w+)\s*\((.*)\)\s*", call)
        if not match:
            raise TableError(f"{entry}: {call!r} is not a call")
        fn, args = match.group(1), split_arguments(match.group(2))
        if fn not in protos:
            raise TableError(f"{entry}: {fn} is not declared in functions.h")
        schema = _schema(entry)
        variants = [entry] + (_out_variants(schema) if item.get("out_variant", True) else [])
        for overload in variants:
            if overload in seen:
                raise TableError(f"{overload}: routed twice")
            seen.add(overload)
            schema = _schema(overload)
            condition = _condition(entry, item["when"], schema) if "when" in item else ""
            found.append(Route(overload, fn, _arguments(entry, args, protos[fn], schema), condition))
    return found


def render(found: list[Route]) -> str:
    lines = ["// Generated by python -m diopi_bindings.gen_dispatch from diopi_functions.yaml; do not edit.",
             '#include "frame.h"', "", "namespace diopi_bindings {", "", "namespace {", ""]
    for i, r in enumerate(found):
        lines.append(f"diopiError_t call_{i}(void* fn, Frame& f) {{  // aten::{r.aten}")
        if r.condition:
            lines.append(f"  if (!({r.condition})) return diopiForceFallbackToCPU;")
        lines.append(f"  return reinterpret_cast<decltype(&::{r.diopi})>(fn)({', '.join(r.arguments)});")
        lines.append("}")
    lines += ["", "}  // namespace", "", "const Route kRoutes[] = {"]
    lines += [f'    {{"aten::{r.aten.split(".")[0]}", "{r.aten.partition(".")[2]}", "{r.diopi}", &call_{i}}},'
              for i, r in enumerate(found)]
    lines += ["};", "const size_t kRouteCount = sizeof(kRoutes) / sizeof(kRoutes[0]);", "",
              "}  // namespace diopi_bindings", ""]
    return "\n".join(lines)


def generate() -> str:
    return render(routes(TABLE.read_text(), FUNCTIONS_H.read_text()))


def write_or_check(generate_text: Callable[[], str], output: Path, module: str, argv: list[str] | None) -> int:
    """The command line of a generator: write ``output``, or with ``--check`` exit 1 when it is stale."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is out of date")
    args = parser.parse_args(argv)
    try:
        text = generate_text()
    except TableError as exc:
        print(f"diopi_functions.yaml: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not output.is_file() or output.read_text() != text:
            print(f"{output.name} is out of date: run python -m {module}", file=sys.stderr)
            return 1
        return 0
    output.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_or_check(generate, OUTPUT, "diopi_bindings.gen_dispatch", argv)


if __name__ == "__main__":
    sys.exit(main())
