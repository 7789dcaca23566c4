"""dicomm-topo: show what dicomm sees of this node's topology and which NIC each local rank uses.

    dicomm-topo [--sysfs-root DIR] [--json] [--local-rank N]
"""
from __future__ import annotations

import argparse
import json
import sys

from dicomm.topology import TopologyError, assign, discover
from dicomm.topology.render import to_dict, to_text
from dicomm.topology.sysfs import ROOT_ENV


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dicomm-topo",
        description="Discover accelerators, RDMA NICs, NUMA nodes and the PCIe tree from sysfs, "
                    "classify every accelerator-NIC path (PIX, PXB, PHB, NODE, SYS) and show the "
                    "NIC each local rank uses, with the reason.")
    p.add_argument("--sysfs-root", metavar="DIR", default=None,
                   help=f"sysfs tree to read (default: ${ROOT_ENV}, else /sys)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--local-rank", metavar="N", type=int, default=None,
                   help="show only this local rank's assignment (what the backend would use)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.local_rank is not None and args.local_rank < 0:
        _parser().error(f"--local-rank must be >= 0, got {args.local_rank}")
    try:
        result = assign(discover(args.sysfs_root))
        if args.json:
            text = json.dumps(to_dict(result, args.local_rank), indent=2) + "\n"
        else:
            text = to_text(result, args.local_rank)
    except TopologyError as e:
        print(f"dicomm-topo: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
