"""Two chip types of one vendor with nodes of one size (an A100 type and an H100 type of 8-GPU nodes) are alike
in process count and vendor: a host that does not say its chip type (HETEROPP_CHIP) is told apart by the name its
device reports, against the cluster spec's `device_name` patterns (heteropp/engine/device_match.py): under
torchrun the node list's entries it can be (node_ranks.match_nodes), in an elastic run its chip type
(elastic.host_chip). Before, such hosts ran whatever their GROUP_RANK left them (a warning), or an elastic worker
stopped ("several chip types run on this host's ditorch vendor"). The expected answers are derived by hand;
this host's device name is read from /proc/cpuinfo by the test itself; real workers check that the name travels
and decides."""
from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.elastic import host_chip
from heteropp.engine.node_ranks import match_nodes, unsure_nodes
from heteropp.plan import Plan, StagePlan
from heteropp.spec import PRESETS, cluster_from_dict
from heteropp.spec.errors import SpecError
from heteropp.spec.io import load_mapping
from tests.heteropp.heteropp_helpers import MODEL

REPO = Path(__file__).resolve().parents[2]
TWO_CPU = REPO / "examples/clusters/two-cpu.yaml"  # big and small: no device, so both cpu
PLAN = Plan([StagePlan("A100", 1, 2), StagePlan("H100", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
            micro_batches=2, num_layers=MODEL.layers)
NODES = [["A100", 1], ["H100", 1]]
SAME = {"A100": "cuda", "H100": "cuda"}
NAMES = {"A100": "*a100*", "H100": "*H100*"}
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"


def _this_cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))


@pytest.mark.parametrize("seen, want", [
    # the H100 host joined as node 0: its name puts it on the H100 entry, the A100 host on the A100 one
    ({0: (None, 1, "cuda", H100), 1: (None, 1, "cuda", A100)}, {0: 1, 1: 0}),
    # a host of a version that wrote no name takes what the named one leaves
    ({0: (None, 1, "cuda"), 1: (None, 1, "cuda", A100)}, {0: 1, 1: 0}),
    # the launch's own numbering where it fits the names
    ({0: (None, 1, "cuda", A100), 1: (None, 1, "cuda", H100)}, {0: 0, 1: 1}),
    # a name no pattern fits: the process count alone, as without names
    ({0: (None, 1, "cuda", "NVIDIA L4"), 1: (None, 1, "cuda", "NVIDIA L4")}, {0: 0, 1: 1}),
    # HETEROPP_CHIP still comes first
    ({0: (None, 1, "cuda", "NVIDIA L4"), 1: ("A100", 1, None, None)}, {0: 1, 1: 0}),
])
def test_a_host_is_placed_by_the_name_its_device_reports(seen, want):
    assert match_nodes(PLAN, NODES, seen, SAME, NAMES) == want


def test_the_names_settle_which_host_is_which_and_nobody_is_warned_about():
    seen = {0: (None, 1, "cuda", H100), 1: (None, 1, "cuda", A100)}
    assert unsure_nodes(PLAN, NODES, seen, SAME, NAMES) == {}
    # without the patterns both could be either (the warning names them)
    assert unsure_nodes(PLAN, NODES, seen, SAME) == {0: ["A100", "H100"], 1: ["A100", "H100"]}
    # a name that fits both patterns settles nothing
    both = {"A100": "NVIDIA*", "H100": "NVIDIA*"}
    assert unsure_nodes(PLAN, NODES, seen, SAME, both) == {0: ["A100", "H100"], 1: ["A100", "H100"]}


@pytest.mark.parametrize("seen, node", [
    ({0: (None, 1, "cuda", A100), 1: (None, 1, "cuda", A100)}, 1),  # two A100s for one A100 node
    ({0: (None, 1, "cuda", H100), 1: ("H100", 1, None, None)}, 0),  # an H100 by name where a host says H100
])
def test_a_host_whose_name_leaves_it_no_node_is_refused_naming_its_device(seen, node):
    name = seen[node][3]
    with pytest.raises(SpecError, match=rf"node {node}'?: 1 processes, vendor 'cuda', device '{name}': "
                                        r"no node of the run's list left"):
        match_nodes(PLAN, NODES, seen, SAME, NAMES)


@pytest.mark.parametrize("raw, want", [(b'[null, 2, "cuda", "NVIDIA H100"]', (None, 2, "cuda", "NVIDIA H100")),
                                       (b'[null, 2, "cuda"]', (None, 2, "cuda", None))])
def test_a_nodes_entry_is_read_with_or_without_its_device_name(raw, want):
    from heteropp.engine.node_gather import _read
    assert _read(1, raw) == want


@pytest.mark.parametrize("raw", [b'[null, 2, "cuda", 7]', b'[null, 2, "cuda", "' + b"x" * 201 + b'"]',
                                 b'[null, 2, "cuda", "a", "b"]'])
def test_a_bad_device_name_field_is_refused_naming_the_node(raw):
    from heteropp.engine.node_gather import _read
    with pytest.raises(SpecError, match=r"node 1'?: told the store .*device name or null\], names of at most 200"):
        _read(1, raw)


def _cluster(patterns: dict[str, str]):
    spec = load_mapping(str(TWO_CPU))
    for c in spec["chips"]:
        if c["name"] in patterns:
            c["device_name"] = patterns[c["name"]]
    return cluster_from_dict(spec, "two-cpu")


def test_an_elastic_host_of_a_vendor_with_several_types_takes_the_type_its_device_name_fits():
    assert host_chip(_cluster({"big": "*EPYC*", "small": "*Xeon*"}), {}, "cpu", "Intel(R) Xeon(R) Gold") == "small"
    with pytest.raises(SpecError, match=r"device name 'AMD EPYC 7B13' of this host fits the device_name of several "
                                        r"chip types of its ditorch vendor 'cpu': big, small"):
        host_chip(_cluster({"big": "*EPYC*", "small": "AMD*"}), {}, "cpu", "AMD EPYC 7B13")
    with pytest.raises(SpecError, match=r"several chip types run on this host's ditorch vendor 'cpu': big, small, "
                                        r"and its device name 'Ampere Altra' fits none"):
        host_chip(_cluster({"big": "*EPYC*"}), {}, "cpu", "Ampere Altra")


@pytest.mark.parametrize("pattern, why", [("", "got ''"), (" ", "got ' '"), ("x" * 201, "got 'xxx"),
                                          (7, "got 7")])
def test_a_bad_device_name_pattern_is_refused_naming_the_field(pattern, why):
    with pytest.raises(SpecError, match=r"chips\[0\]\.device_name'?: " + why):
        _cluster({"big": pattern})


def test_this_hosts_device_name_is_what_it_reports():
    from heteropp.engine.device_match import host_device_name
    assert host_device_name("cpu") == _this_cpu()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_elastic_worker_without_a_chip_type_trains_the_type_its_cpu_is_named_as(tmp_path):
    """Both types of the spec on the CPU, no chip map: `small`'s pattern is this host's processor model, `big`'s
    one no device has. The one-rank worker says it took `small` and trains it (before: exit 2, 'several chip
    types run on this host's ditorch vendor')."""
    plan = {"version": 2, "stages": [{"chip": "small", "tp": 1, "layers": 8}], "dp": 1, "micro_batch_size": 1,
            "micro_batches": 2}
    cfg = RunConfig(plan=plan, model=RunConfig.model_dict(PRESETS["tiny"]), steps=1, backend="gloo", timeout_s=60,
                    options={"checkpoint_dir": str(tmp_path / "ck")})
    spec = load_mapping(str(TWO_CPU))
    for c in spec["chips"]:
        c["device_name"] = f"*{glob.escape(_this_cpu())}*" if c["name"] == "small" else "*no such device*"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**cfg.__dict__, "elastic": {
        "cluster": spec, "train": {"global_batch": 2, "micro_batch_size": 1}}}))
    env = {k: v for k, v in os.environ.items() if k not in ("HETEROPP_CHIP", "DIOPI_LIBRARY")}
    env.update(DITORCH_VENDOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "heteropp.engine.elastic", "--config", str(path)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [x for x in r.stdout.splitlines() if "chip type" in x]
    assert len(said) == 1 and "'small'" in said[0] and repr(_this_cpu()) in said[0], r.stdout
    rounds = [json.loads(x) for x in (tmp_path / "ck/elastic.jsonl").read_text().splitlines()]
    assert [e["chips"] for e in rounds if e["event"] == "round"] == [{"small": 1}]


def test_names_that_fit_overlapping_types_still_find_the_matching_that_exists():
    """Three one-process nodes, A100, A10080 and H100, of one vendor; patterns '*A100*', '*80GB*' and '*H100*'.
    Host 0 reports an A100 80GB (it fits A100 and A10080), host 1 an H100, host 2 an A100 40GB (A100 only).
    Taking the first free entry puts host 0 on A100 and leaves host 2 nothing (refused before); host 0 moves to
    A10080 instead. With host 1 an A100 80GB too, three hosts fit two entries: refused, naming host 2."""
    plan = Plan([StagePlan("A100", 1, 1), StagePlan("A10080", 1, 1, first_layer=1),
                 StagePlan("H100", 1, 2, first_layer=2)], dp=1, micro_batch_size=1, micro_batches=2,
                num_layers=MODEL.layers)
    nodes = [["A100", 1], ["A10080", 1], ["H100", 1]]
    names = {"A100": "*A100*", "A10080": "*80GB*", "H100": "*H100*"}
    same = {t: "cuda" for t in names}
    both, pcie, small = "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-40GB"
    # host 0 fits A100 and A10080, host 1 H100, host 2 only A100: host 0 must yield A100 to host 2
    got = match_nodes(plan, nodes, {0: (None, 1, "cuda", both), 1: (None, 1, "cuda", H100),
                                    2: (None, 1, "cuda", small)}, same, names)
    assert got == {0: 1, 1: 2, 2: 0}
    with pytest.raises(SpecError, match=r"node 2'?: .*device 'NVIDIA A100-SXM4-40GB'"):
        match_nodes(plan, nodes, {0: (None, 1, "cuda", both), 1: (None, 1, "cuda", pcie),
                                  2: (None, 1, "cuda", small)}, same, names)
