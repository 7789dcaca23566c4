"""Path classes. Fake sysfs trees stand in for server topologies; every expected matrix below is
written by hand from the layout drawn in the fake server's docstring, not computed."""
from __future__ import annotations

from dicomm.topology import PathClass, PciLocation, assign, classify, discover
from tests.dicomm import fake_sysfs as fake


def _matrix(root) -> list[str]:
    result = assign(discover(str(root)), {})
    nics = result.topology.nics
    return [" ".join(result.path(a, n)[0].name for n in nics) for a in result.topology.accelerators]


def test_8gpu_8nic_matrix(tmp_path_factory):
    root = fake.build(fake.server_8gpu_8nic, tmp_path_factory)
    # own sub-switch PIX, sibling sub-switch PXB, other top switch on the host bridge PHB,
    # other socket SYS
    assert _matrix(root) == [
        "PIX PXB PHB PHB SYS SYS SYS SYS",
        "PXB PIX PHB PHB SYS SYS SYS SYS",
        "PHB PHB PIX PXB SYS SYS SYS SYS",
        "PHB PHB PXB PIX SYS SYS SYS SYS",
        "SYS SYS SYS SYS PIX PXB PHB PHB",
        "SYS SYS SYS SYS PXB PIX PHB PHB",
        "SYS SYS SYS SYS PHB PHB PIX PXB",
        "SYS SYS SYS SYS PHB PHB PXB PIX",
    ]


def test_8gpu_4nic_matrix(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    # one switch per host bridge, two host bridges per NUMA node
    assert _matrix(root) == ["PIX NODE SYS SYS"] * 2 + ["NODE PIX SYS SYS"] * 2 + \
        ["SYS SYS PIX NODE"] * 2 + ["SYS SYS NODE PIX"] * 2


def test_16acc_4nic_matrix(tmp_path_factory):
    root = fake.build(fake.server_16acc_4nic, tmp_path_factory)
    assert _matrix(root) == ["PIX PIX SYS SYS"] * 8 + ["SYS SYS PIX PIX"] * 8


def test_1nic_matrix(tmp_path_factory):
    root = fake.build(fake.server_1nic, tmp_path_factory)
    assert _matrix(root) == ["PIX", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]


def test_nic_without_switch_matrix(tmp_path_factory):
    root = fake.build(fake.server_nic_no_switch, tmp_path_factory)
    assert _matrix(root) == ["PHB"] * 4 + ["SYS"] * 4


def _loc(host: str, *bridges: str, numa: int = 0) -> PciLocation:
    return PciLocation(address="0000:ff:00.0", host_bridge=host, bridges=bridges, numa_node=numa)


def test_classify_rules_directly():
    a = _loc("pci0000:00", "rp1", "up", "dn1")
    assert classify(a, _loc("pci0000:00", "rp1", "up", "dn2"))[0] is PathClass.PIX
    assert classify(a, _loc("pci0000:00", "rp1", "up", "dn3", "up2", "dn4"))[0] is PathClass.PXB
    assert classify(a, _loc("pci0000:00", "rp2"))[0] is PathClass.PHB
    assert classify(a, _loc("pci0000:40", "rp3"))[0] is PathClass.NODE
    assert classify(a, _loc("pci0000:80", "rp4", numa=1))[0] is PathClass.SYS
    assert classify(a, None)[0] is PathClass.SYS


def test_unknown_numa_node_is_not_taken_as_the_same_node():
    cls, why = classify(_loc("pci0000:00", "rp1", numa=-1), _loc("pci0000:40", "rp2", numa=-1))
    assert cls is PathClass.SYS and "unknown" in why


def test_affinity_is_pix_and_pxb_only():
    assert [c.name for c in PathClass if c.affinity] == ["PIX", "PXB"]
