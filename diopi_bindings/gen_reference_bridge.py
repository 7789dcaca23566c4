"""Generate the reference library's DIOPI functions (reference/deeplink/bridge.gen.cpp) from diopi_functions.yaml
and the reference's own schema: ``python -m diopi_bindings.gen_reference_bridge`` (``--check``: exit 1 when stale).

Each DIOPI function of the table (from its first entry) becomes a function that views its handles in the
reference's tensor struct and calls the reference kernel of the same ATen operator, its arguments matched by
ATen name: a DIOPI result fills the kernel's outputs in order, a scalar where the kernel takes a tensor becomes a
0-dim tensor of the result's dtype, a literal of the table (RoundModeNone) is required of the caller. What the
reference cannot serve (no kernel, another rounding mode) it declines with diopiNoImplement.
"""
from __future__ import annotations

import re
import sys

import yaml

from diopi_bindings.gen_dispatch import FUNCTIONS_H, HERE, TABLE, TableError, split_arguments, write_or_check
from diopi_bindings.schema import BY_NAME, OpSchema

OUTPUT = HERE / "reference" / "deeplink" / "bridge.gen.cpp"
# bridge.cpp: Index allocates its result; the reference has no le kernel. random.cpp: no random kernels.
# fast_matmul.cpp: float32 products tried before the reference kernel (which declines nothing of theirs).
FAST = {"diopiMm", "diopiBmm", "diopiAddmm"}
HANDWRITTEN = {"diopiIndex", "diopiLe", "diopiNormalInp", "diopiUniformInp", "diopiDropout"}
# ATen overloads the reference serves with another operator's kernel.
SAME_KERNEL = {"_index_put_impl_": "aten::index_put", "index_add": "aten::index_put", "index_add_": "aten::index_put",
               "arange.start_out": "aten::arange.start_step",
               "add.Scalar": "aten::add.Tensor", "add_.Scalar": "aten::add.Tensor", "mul.Scalar": "aten::mul.Tensor",
               "mul_.Scalar": "aten::mul.Tensor", "div.Scalar": "aten::div.Tensor"}
# A kernel scalar the DIOPI function does not pass: its value.
ABSENT = {"alpha": "1.0", "min": "-std::numeric_limits<double>::infinity()",
          "max": "std::numeric_limits<double>::infinity()", "half_to_float": "false"}


def parameters(text: str) -> dict[str, list[tuple[str, str]]]:
    """DIOPI function -> [(type, name)] from functions.h."""
    found = {}
    for name, params in re.findall(r"diopiError_t\s+(diopi\w+)\s*\(([^;]*?)\)\s*;", text, re.S):
        pairs = []
        for param in params.split(","):
            words = " ".join(param.split())
            ctype, pname = re.match(r"(.*?)\s*(\w+)$", words).groups()
            pairs.append((ctype.replace(" *", "*"), pname))
        found[name] = pairs
    return found


def kernel_for(aten: str) -> OpSchema | None:
    base, _, overload = aten.partition(".")
    names = [SAME_KERNEL.get(aten), f"aten::{aten}", f"aten::{base.rstrip('_')}" + (f".{overload}" if overload else "")]
    return next((BY_NAME[n] for n in names if n in BY_NAME), None)


def bridge(fn: str, params: list[tuple[str, str]], tokens: list[str], kernel: OpSchema) -> str:
    by_token = {tok: (ctype, name) for tok, (ctype, name) in zip(tokens, params)}
    by_name = {name: (ctype, name) for ctype, name in params}
    consumed: set[str] = set()

    def lookup(arg: str) -> tuple[str | None, str | None]:
        """The DIOPI parameter a kernel argument reads: by the table's token, else by DIOPI's own name."""
        for found in (by_token.get(arg), by_name.get(arg), by_name.get("input") if arg == "self" else None):
            if found is not None and found[1] not in consumed:
                return found
        return by_token.get(arg, (None, None))

    results = [name for tok, (ctype, name) in zip(tokens, params)
               if re.fullmatch(r"out\d*", tok) or (ctype == "diopiTensorHandle_t" and tok != "ctx")]
    first_tensor = next((name for ctype, name in params if ctype.startswith("diopi") and "Tensor" in ctype
                         and not ctype.endswith("*")), "nullptr")
    result = results[0] if results else first_tensor
    consumed.update(results)
    args = []
    outputs = iter(results)
    for arg in kernel.args:
        if arg.is_output:
            args.append(f"c.view({next(outputs)})")
            continue
        ctype, name = lookup(arg.name)
        if name is not None and arg.kind not in ("in", "in?") or ctype not in (None, "diopiTensorHandle_t"):
            consumed.add(name)
        if arg.kind in ("in", "in?"):
            if ctype is None:
                args.append("nullptr")
            elif ctype == "const diopiScalar_t*":
                args.append(f"c.scalar_like({name}, {result})")
            else:
                args.append(f"c.view({name})")
        elif arg.kind in ("in[]", "in?[]"):
            count = params[[n for _, n in params].index(name) + 1][1]  # DIOPI passes a list's length next
            consumed.add(count)
            args.append(f"c.list({name}, {count})")
        elif arg.kind == "double":
            if ctype == "const diopiScalar_t*":
                args.append(f"bridge::value({name}, {ABSENT.get(arg.name, '0.0')})")
            elif ctype is not None:
                args.append(f"static_cast<double>({name})")
            else:
                args.append(ABSENT.get(arg.name, "0.0"))
        elif arg.kind in ("int", "bool"):
            if ctype is not None:
                args.append(name)
            elif arg.name == "keepdim":
                args.append(f"c.keepdim({results[0]}, {lookup('self')[1]})")
            else:
                args.append(ABSENT.get(arg.name, "0"))
        elif arg.kind == "ints":
            args.append(f"legacy::diopiSize_t{{{name}.data, {name}.len}}")
        else:
            raise TableError(f"{fn}: the reference kernel {kernel.aten} takes {arg.kind} {arg.name}")
    # A DIOPI parameter the kernel has no argument for must have the value the table passes.
    checks = [f"  if ({name} != {tok}) return diopiNoImplement;" for tok, (ctype, name) in zip(tokens, params)
              if tok in ("RoundModeNone", "false", "true") and name not in consumed]
    signature = ", ".join(f"{ctype} {name}" for ctype, name in params)
    fast = ([f"  if (const diopiError_t code = fast::{fn}({', '.join(name for _, name in params)}); "
             f"code != diopiNoImplement) return code;"] if fn in FAST else [])
    body = [f"extern \"C\" diopiError_t {fn}({signature}) {{  // {kernel.aten}", *checks, *fast,
            "  bridge::Call c(ctx);"]
    body += [f"  auto a{i} = {expr};" for i, expr in enumerate(args)]
    body += ["  if (c.status() != diopiSuccess) return c.status();",
             f"  return c.finish(legacy::{kernel.symbol}(c.context(){''.join(f', a{i}' for i in range(len(args)))}));",
             "}"]
    return "\n".join(body)


def generate() -> str:
    protos = parameters(FUNCTIONS_H.read_text())
    done: set[str] = set()
    parts = ["// Generated by python -m diopi_bindings.gen_reference_bridge from diopi_functions.yaml; do not edit.",
             '#include "bridge.h"', ""]
    for item in yaml.safe_load(TABLE.read_text()):
        match = re.fullmatch(r"\s*(diopi\w+)\s*\((.*)\)\s*", item["diopi"])
        fn, tokens = match.group(1), split_arguments(match.group(2))
        if fn in done or fn in HANDWRITTEN:
            continue
        done.add(fn)
        kernel = kernel_for(item["aten"])
        if kernel is None:
            raise TableError(f"{item['aten']}: the reference has no kernel for {fn}")
        parts += [bridge(fn, protos[fn], tokens, kernel), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(generate, OUTPUT, "diopi_bindings.gen_reference_bridge", argv)


if __name__ == "__main__":
    sys.exit(main())
