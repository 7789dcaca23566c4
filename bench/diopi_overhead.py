"""Per-call overhead of the DIOPI binding against calling torch directly, on small tensors.

``python -m bench.diopi_overhead [--rounds 11] [--calls 5000] [--library LIB] [--json FILE]``: each
workload runs as torch (its ``out=`` form, no allocation) and through ``DiopiLibrary.call`` into the
library (the reference by default), in alternating blocks; medians of the per-call time. "same shapes"
repeats one set of tensors (a training loop's steady state), "new shapes" alternates two shapes so that
every call rewrites its handles. The overhead is the difference; the target is 5 us or less.

``--device native|python|diopi``: also an operation on the diopi device (the ATen dispatch, the router and the
library call: what a model pays per operator), against the same operation on the CPU and against the
library call alone (the library's kernel with the binding: the floor the device can reach); the device
operation's CPU time (this process's, per call) beside its wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

TARGET_US = 5.0


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def workloads(lib) -> dict[str, tuple[Callable, Callable]]:
    """name -> (torch call, library call), on 16-element float32 tensors."""
    shapes = [((16,), (16,)), ((4, 4), (4, 4))]
    a, b, out = torch.randn(16), torch.randn(16), torch.empty(16)
    m, n, mo = torch.randn(4, 4), torch.randn(4, 4), torch.empty(4, 4)
    pairs = [tuple(torch.randn(s) for s in shape) + (torch.empty(shape[0]),) for shape in shapes]
    flip = [0]

    def lib_add_new_shapes():
        flip[0] ^= 1
        x, y, o = pairs[flip[0]]
        lib.call("aten::add.Tensor", o, x, y, 1.0)

    def torch_add_new_shapes():
        flip[0] ^= 1
        x, y, o = pairs[flip[0]]
        torch.add(x, y, out=o)

    return {
        "add, same shapes": (lambda: torch.add(a, b, out=out), lambda: lib.call("aten::add.Tensor", out, a, b, 1.0)),
        "add, new shapes": (torch_add_new_shapes, lib_add_new_shapes),
        "silu, same shapes": (lambda: torch.ops.aten.silu.out(a, out=out), lambda: lib.call("aten::silu", out, a)),
        "mm 4x4, same shapes": (lambda: torch.mm(m, n, out=mo), lambda: lib.call("aten::mm", mo, m, n)),
    }


def device_workloads(lib, backend: str) -> dict[str, tuple[Callable, Callable, Callable]]:
    """name -> (torch on the CPU, the library call, the same torch call on the diopi device)."""
    from diopi_bindings import deeplink, device

    device.enable(lib, backend="native" if backend == "diopi" else backend)
    if backend == "diopi":  # the reference under DIOPI's names, routed in C++
        deeplink.attach(deeplink.reference_path())
    a, b, out = torch.randn(16), torch.randn(16), torch.empty(16)
    m, n, mo = torch.randn(4, 4), torch.randn(4, 4), torch.empty(4, 4)
    da, db, dout, dm, dn, dmo = (t.to("diopi") for t in (a, b, out, m, n, mo))
    return {
        "device add out=": (lambda: torch.add(a, b, out=out), lambda: lib.call("aten::add.Tensor", out, a, b, 1.0),
                            lambda: torch.add(da, db, out=dout)),
        "device add (a + b)": (lambda: a + b, lambda: lib.call("aten::add.Tensor", out, a, b, 1.0), lambda: da + db),
        "device silu": (lambda: torch.nn.functional.silu(a), lambda: lib.call("aten::silu", out, a),
                        lambda: torch.nn.functional.silu(da)),
        "device mm 4x4": (lambda: torch.mm(m, n), lambda: lib.call("aten::mm", mo, m, n), lambda: torch.mm(dm, dn)),
        "device mm 4x4 out=": (lambda: torch.mm(m, n, out=mo), lambda: lib.call("aten::mm", mo, m, n),
                               lambda: torch.mm(dm, dn, out=dmo)),
    }


def _median_us(fns: tuple[Callable, ...], rounds: int, calls: int) -> tuple[list[float], list[float]]:
    """Per function: the median per-call wall time and the median per-call CPU time of this process, in us."""
    for fn in fns:  # warm up
        _per_call_us(fn, calls // 5)
    times: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            c0 = time.process_time()
            times[i].append(_per_call_us(fn, calls))
            cpu[i].append((time.process_time() - c0) / calls * 1e6)
    return [statistics.median(t) for t in times], [statistics.median(t) for t in cpu]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diopi_overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--library", help="DIOPI library (default: $DIOPI_LIBRARY, else the reference)")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--device", choices=("native", "python", "diopi"),
                    help="also time operations on the diopi device of this backend (diopi: the native device with "
                         "the reference attached under DIOPI's names)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 5:  # the warm-up runs calls // 5 times and divides by it
        ap.error(f"--rounds must be >= 1 and --calls >= 5, got --rounds {args.rounds} --calls {args.calls}")
    from diopi_bindings.library import load

    torch.set_num_threads(1)
    lib = load(args.library)
    rows = []
    print(f"{'workload':<22} {'torch us':>9} {'diopi us':>9} {'overhead us':>12}")
    for name, (plain, bound) in workloads(lib).items():
        for fn in (plain, bound):  # warm up
            _per_call_us(fn, args.calls // 5)
        t_plain, t_bound = [], []
        for _ in range(args.rounds):
            t_plain.append(_per_call_us(plain, args.calls))
            t_bound.append(_per_call_us(bound, args.calls))
        p, d = statistics.median(t_plain), statistics.median(t_bound)
        rows.append({"workload": name, "torch_us": p, "diopi_us": d, "overhead_us": d - p})
        print(f"{name:<22} {p:9.2f} {d:9.2f} {d - p:12.2f}")
    worst = max(r["overhead_us"] for r in rows)
    print(f"worst overhead {worst:.2f} us (target <= {TARGET_US} us): {'met' if worst <= TARGET_US else 'NOT met'}")
    device_rows = []
    if args.device:
        print(f"\n{'on the ' + args.device + ' device':<22} {'cpu us':>9} {'lib us':>9} {'device us':>10} "
              f"{'over lib us':>12} {'device cpu-time us':>19}")
        for name, fns in device_workloads(lib, args.device).items():
            (cpu, call, dev), (_, _, dev_cpu) = _median_us(fns, args.rounds, args.calls)
            device_rows.append({"workload": name, "cpu_us": cpu, "library_call_us": call, "device_us": dev,
                                "over_library_us": dev - call, "device_cpu_time_us": dev_cpu})
            print(f"{name:<22} {cpu:9.2f} {call:9.2f} {dev:10.2f} {dev - call:12.2f} {dev_cpu:19.2f}")
        worst_dev = max(r["over_library_us"] for r in device_rows)
        print(f"worst device overhead over the library call {worst_dev:.2f} us (target <= {TARGET_US} us): "
              f"{'met' if worst_dev <= TARGET_US else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"library": f"{lib.vendor} {lib.version}", "rows": rows, "target_us": TARGET_US,
                       "device": args.device, "device_rows": device_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
