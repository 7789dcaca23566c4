"""``diopi-conformance``: run the operator conformance suite against a DIOPI library.

The library is one of the project's ABI (``diopi_aten_*`` functions) or one written to DeepLink's DIOPI
(``diopiGetVersion``, ``diopiAdd``, ``diopiSoftmax``, ...), told apart by what it exports; a DIOPI one runs on
the native device through the routes of ``diopi_functions.yaml`` (``conformance/diopi_named.py``).

Exit status: 0 every implemented operator passes (missing ones are "not implemented"), 1 some case
failed or returned an error, 2 bad usage (unknown operator, unusable library or vendor file).
"""
from __future__ import annotations

import argparse
import sys

from diopi_bindings.conformance.device_memory import RUNTIME_OP, run_device_memory
from diopi_bindings.conformance.diopi_named import DiopiNamedLibrary, exports_diopi_names
from diopi_bindings.conformance.report import table, write_html, write_json
from diopi_bindings.conformance.runner import FAILING, SKIPPED, CaseResult, Library, run
from diopi_bindings.conformance.vendor import VendorFile, VendorFileError, load_vendor_file
from diopi_bindings.library import DiopiLibrary, LibraryError, reference_library_path
from diopi_bindings.schema import BY_NAME


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diopi-conformance", description=__doc__.splitlines()[0])
    p.add_argument("--impl", help="the library to test (.so); default: the reference library")
    p.add_argument("--ops", nargs="+", metavar="OP", help="ATen names of the operators to test (default: all)")
    p.add_argument("--vendor-file", help="YAML/JSON with per-operator skips and tolerances")
    p.add_argument("--json", metavar="FILE", help="write every case and verdict as JSON")
    p.add_argument("--html", metavar="FILE", help="write the per-operator table as HTML")
    p.add_argument("--quick", action="store_true", help="leave out the large cases (while iterating on kernels)")
    p.add_argument("--device", choices=("host", "native"),
                   help="where the tensors live: host memory (the default for a library of the project's ABI) or the "
                        "native diopi device, whose memory comes from the library's diopi_device_malloc (always, for "
                        "a library written to DeepLink's DIOPI)")
    p.add_argument("--list", action="store_true", help="list the operators of the schema and exit")
    p.add_argument("--no-isolate", action="store_true",
                   help="run the cases in this process (a crashing kernel then ends the run; for debuggers)")
    p.add_argument("--case-timeout", type=float, default=600.0, metavar="S",
                   help="seconds one case may run before its process is killed and it fails (default 600)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def _usage_error(message: str) -> int:
    print(f"diopi-conformance: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        print("\n".join(f"{name}  [{', '.join(op.dtypes)}]" for name, op in BY_NAME.items()))
        print(f"{RUNTIME_OP}  [bytes]  (the optional device-memory functions)")
        return 0
    unknown = [op for op in args.ops or [] if op not in BY_NAME and op != RUNTIME_OP]
    if unknown:
        return _usage_error(f"unknown operator(s) {', '.join(unknown)}; see --list for the schema's ATen names")
    if not args.case_timeout > 0:
        return _usage_error(f"--case-timeout must be a positive number of seconds, got {args.case_timeout:g}")
    named = args.impl is not None and exports_diopi_names(args.impl)
    if named and args.device == "host":
        return _usage_error(f"{args.impl} is written to DeepLink's DIOPI: its tensors are the native device's "
                            "(leave out --device host)")
    lib: Library
    try:
        vendor = load_vendor_file(args.vendor_file) if args.vendor_file else VendorFile()
        lib = _load_named(args.impl) if named else DiopiLibrary(args.impl or reference_library_path())
    except (VendorFileError, LibraryError) as exc:
        return _usage_error(str(exc))

    device = None
    if named:
        import torch

        device = torch.device("diopi", 0)
    elif args.device == "native":
        from diopi_bindings.device import DiopiDeviceError, enable

        try:
            enable(lib, backend="native")
        except DiopiDeviceError as exc:
            return _usage_error(f"--device native: {exc}")
        import torch

        device = torch.device("diopi", 0)

    def progress(op: str, results: list) -> None:
        if not args.quiet:
            bad = sum(r.status in FAILING for r in results)
            print(f"  {op}: {len(results)} case(s){f', {bad} failing' if bad else ''}", file=sys.stderr)

    operators = None if args.ops is None else [op for op in args.ops if op != RUNTIME_OP]
    results = (run(lib, operators, vendor, progress, quick=args.quick, device=device, isolate=not args.no_isolate,
                   case_timeout=args.case_timeout) if operators != [] else [])
    if args.ops is None or RUNTIME_OP in args.ops:
        if isinstance(lib, DiopiLibrary):
            results += run_device_memory(lib)
        else:
            results.append(CaseResult(RUNTIME_OP, "*", "bytes", SKIPPED, "DIOPI has no device-memory functions in the "
                                      "library: the framework's runtime provides the memory"))
    info = lib.info()
    print(table(results, info, vendor.tolerance))
    if args.json:
        write_json(args.json, results, info, vendor.tolerance)
    if args.html:
        write_html(args.html, results, info, vendor.tolerance)
    return 1 if any(r.status in FAILING for r in results) else 0


def _load_named(path: str) -> DiopiNamedLibrary:
    """The DIOPI library attached to the native device; LibraryError when it cannot be."""
    from diopi_bindings.deeplink import DiopiLoadError
    from diopi_bindings.device import DiopiDeviceError

    try:
        return DiopiNamedLibrary(path)
    except (DiopiLoadError, DiopiDeviceError) as exc:
        raise LibraryError(str(exc)) from None


if __name__ == "__main__":
    raise SystemExit(main())
