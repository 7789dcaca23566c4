"""Clusters of the HeteroAuto robustness findings (issue 30): slow links between types, one dominant type
next to many small ones, many types, and chip counts one off a round number. Shared by
bench.heteroauto_search --robust and tests/heteroauto (determinism, baselines, monotonicity).

    python -m bench.heteroauto_scenarios            # plan each one, print h2, auto and the best single type
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.heteroauto_search import SCALE_TYPES, scale_cluster

EX = Path(__file__).resolve().parents[1] / "examples"
H200 = (141, 990, 8)  # memory GB, peak TFLOPS, chips per node (SCALE_TYPES' last)


def slow_links(counts: list[int], gbps: float = 10.0, latency: str = "2ms") -> dict:
    """`counts` chips of the first types of SCALE_TYPES with H200 first, every pair of types joined by a
    `gbps` link of `latency`."""
    spec = scale_cluster(counts, types=[H200, *SCALE_TYPES[:-1]])
    names = [c["name"] for c in spec["chips"]]
    spec["links"] = [{"between": [a, b], "bandwidth": f"{gbps:g}Gbps", "latency": latency}
                     for i, a in enumerate(names) for b in names[i + 1:]]
    return spec


SCENARIOS = {  # name: (cluster spec, training file)
    "1,024 x 3 slow links": (slow_links([512, 256, 256]), "gbs-2m"),
    "98,304 H200 + 7 x 1,024": (scale_cluster([98_304] + [1024] * 7, types=[H200, *SCALE_TYPES[:-1]]), "gbs-2m"),
    "1,024 x 8": (scale_cluster([128] * 8), "gbs-2m"),
    "10,240 x 6 H200": (scale_cluster([1707] + [1706] * 5, types=[H200, *SCALE_TYPES[:-1]]), "gbs-2m"),
}


def write(spec: dict, folder: str) -> str:
    p = Path(folder) / f"{spec['name']}.json"
    p.write_text(json.dumps(spec))
    return str(p)


def main(argv: list[str] | None = None) -> int:
    from heteropp.auto import DEFAULT_BUDGET, load_problem, plan
    from heteropp.spec import InfeasibleError
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        for name in a.only:
            spec, train = SCENARIOS[name]
            pb = load_problem(write(spec, d), "h2-100b", str(EX / "training" / f"{train}.yaml"))
            row = {}
            for algo in ("h2", "auto"):
                try:
                    out = plan(pb, DEFAULT_BUDGET, algo)
                except InfeasibleError:  # h2 needs every chip to serve
                    row[algo] = "no plan"
                    continue
                row[algo] = f"{out.plan.iteration_time_s:8.3f} s ({out.cpu_time_s:.2f} s CPU)"
            print(f"{name:>26} | h2 {row['h2']:>22} | auto {row['auto']:>22}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
