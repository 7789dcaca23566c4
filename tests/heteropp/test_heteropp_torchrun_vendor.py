"""Under torchrun, a node whose host does not set HETEROPP_CHIP is still placed by what it is: the ditorch
vendor its host chose (DITORCH_VENDOR, else the first available) and the run's chip map say which entries of
the node list it can be (heteropp/engine/node_ranks.match_nodes, fed by node_gather.py). Two real torchrun
agents on loopback: node A's host plain (the CPU), node B's with DITORCH_VENDOR=diopi (the CPU reference DIOPI
library), one process each, chip map {A: cpu, B: diopi}, started with --node-rank swapped against the list.
Before, the process counts alone matched and the launch's own numbering was kept: the A host was handed the
DIOPI stage ("not usable on this host"). Now each host runs its own type's stage, on its own device, and the
losses are the single-process reference's. The matching itself is checked against answers derived by hand."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.node_ranks import match_nodes, unsure_nodes
from heteropp.plan import Plan, StagePlan
from heteropp.spec.errors import SpecError
from tests.heteropp.heteropp_helpers import MODEL, check_losses, reference

STEPS = 2
# A: layers 0-1 on one chip (plan rank 0), B: layers 2-3 on one chip (plan rank 1)
PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
            micro_batches=2, num_layers=MODEL.layers)
NODES = [["A", 1], ["B", 1]]
CHIP_MAP = {"A": "cpu", "B": "diopi"}
SAME = {"A": "cpu", "B": "cpu"}  # both types on one vendor: the vendor tells them apart no more than the count
# A one-chip, B a TP-2 stage on a two-chip node
TP_PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 2, 2, first_layer=2)], dp=1, micro_batch_size=1,
               micro_batches=2, num_layers=MODEL.layers)
_STAGE_LINE = re.compile(r"rank (\d+): stage (\d+) \((\w+), .* on (\w+)")


@pytest.mark.parametrize("seen, chip_map, want", [
    # the DIOPI host joined as node 0: its vendor puts it on B's entry, the CPU host on A's
    ({0: (None, 1, "diopi"), 1: (None, 1, "cpu")}, CHIP_MAP, {0: 1, 1: 0}),
    # a host of a version that wrote no vendor (two fields) takes what the other's vendor leaves
    ({0: (None, 1), 1: (None, 1, "cpu")}, CHIP_MAP, {0: 1, 1: 0}),
    ({0: (None, 1, "diopi"), 1: (None, 1)}, CHIP_MAP, {0: 1, 1: 0}),
    # the launch's numbering where it fits the vendors
    ({0: (None, 1, "cpu"), 1: (None, 1, "diopi")}, CHIP_MAP, {0: 0, 1: 1}),
    # no entry's chip type runs on the host's vendor: the process count alone, as without vendors
    ({0: (None, 1, "diopi"), 1: (None, 1, "diopi")}, SAME, {0: 0, 1: 1}),
    # HETEROPP_CHIP still places a host first
    ({0: (None, 1, "cpu"), 1: ("A", 1, None)}, SAME, {0: 1, 1: 0}),
])
def test_a_host_that_does_not_say_its_chip_type_is_placed_by_its_vendor(seen, chip_map, want):
    assert match_nodes(PLAN, NODES, seen, chip_map) == want


def test_a_host_whose_vendor_has_no_entry_of_its_process_count_is_refused_naming_the_vendor():
    """A two-process CPU host: the list's only CPU entry (A) has one process, B's two-process entry runs on
    DIOPI, which this host did not choose."""
    with pytest.raises(SpecError, match=r"node 0'?: 2 processes, vendor 'cpu': no node of the run's list left"):
        match_nodes(TP_PLAN, [["A", 1], ["B", 2]], {0: (None, 2, "cpu"), 1: (None, 1, "diopi")}, CHIP_MAP)


def test_a_host_whose_vendor_settles_its_chip_type_is_not_warned_about():
    assert unsure_nodes(PLAN, NODES, {0: (None, 1, "diopi"), 1: (None, 1, "cpu")}, CHIP_MAP) == {}
    # vendor unknown (an older node), or one no entry runs on, or one both types run on: either type
    assert unsure_nodes(PLAN, NODES, {0: (None, 1, "diopi"), 1: (None, 1)}, CHIP_MAP) == {1: ["A", "B"]}
    assert unsure_nodes(PLAN, NODES, {0: (None, 1, "diopi"), 1: ("B", 1, None)}, SAME) == {0: ["A", "B"]}
    assert unsure_nodes(PLAN, NODES, {0: (None, 1, "cpu"), 1: (None, 1, "cpu")}, SAME) == {0: ["A", "B"],
                                                                                       1: ["A", "B"]}


@pytest.mark.parametrize("raw, want", [(b'["B", 2]', ("B", 2, None, None)),
                                       (b'[null, 2, "diopi"]', (None, 2, "diopi", None))])
def test_a_nodes_entry_is_read_with_or_without_its_vendor(raw, want):
    from heteropp.engine.node_gather import _read
    assert _read(1, raw) == want


@pytest.mark.parametrize("raw", [b'[null, 2, 7]', b'[null, 2, ["cpu"]]', b'[null, 2, "cpu", "name", 1]'])
def test_a_bad_vendor_field_is_refused_naming_the_node(raw):
    from heteropp.engine.node_gather import _read
    with pytest.raises(SpecError, match=r"node 1'?: told the store .*expected \[chip type or null, processes >= 1, "
                                        r"vendor or null, device name or null\]"):
        _read(1, raw)


def test_a_host_whose_ditorch_vendor_names_no_usable_vendor_is_told_so(monkeypatch):
    from heteropp.engine.node_gather import host_vendor
    monkeypatch.delenv("DIOPI_LIBRARY", raising=False)
    with pytest.raises(SpecError, match=r"DITORCH_VENDOR'?: DITORCH_VENDOR='nosuch' names no known vendor"):
        host_vendor({"DITORCH_VENDOR": "nosuch"})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_under_torchrun_each_host_runs_the_stage_of_its_vendor(tmp_path):
    cfg = RunConfig(plan=PLAN.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, backend="gloo",
                    chip_map=CHIP_MAP, timeout_s=60, verbose=True, loss_log=str(tmp_path / "loss.jsonl"),
                    nodes=NODES)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.__dict__))
    port = _port()
    base = {k: v for k, v in os.environ.items() if k not in ("DITORCH_VENDOR", "DIOPI_LIBRARY", "HETEROPP_CHIP")}
    # the DIOPI host started as node 0, the CPU host as node 1: the list says node 0 is A (cpu), node 1 B (diopi)
    hosts = [{"DITORCH_VENDOR": "diopi"}, {}]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank", str(i),
                                "--nproc-per-node=1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                "--max-restarts", "0", "-m", "heteropp.engine.worker", "--config", str(path)],
                               env={**base, "OMP_NUM_THREADS": "1", **extra}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for i, extra in enumerate(hosts)]
    outs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n----\n".join(out[-3000:] for out in outs)
    assert not any("heteropp worker: warning" in out for out in outs)  # the vendors settle which host is which
    # by hand: the DIOPI host runs B's stage (plan rank 1) on the DIOPI device, the CPU host A's on the CPU
    got = [[(int(m[1]), int(m[2]), m[3], m[4]) for m in _STAGE_LINE.finditer(out)] for out in outs]
    assert got == [[(1, 1, "B", "diopi")], [(0, 0, "A", "cpu")]]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    check_losses(losses, reference(PLAN.global_batch)["losses"][:STEPS], "torchrun, hosts placed by vendor")
