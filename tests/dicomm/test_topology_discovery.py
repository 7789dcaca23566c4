"""Discovery from sysfs. Fake sysfs trees stand in for server topologies; the real /sys of the
machine running the tests checks that discovery never crashes on a kernel's own tree."""
from __future__ import annotations

import glob
import os

from dicomm.topology import discover
from tests.dicomm import fake_sysfs as fake


def test_8gpu_8nic_devices_in_pci_order_and_bmc_vga_ignored(tmp_path_factory):
    root = fake.build(fake.server_8gpu_8nic, tmp_path_factory)
    topo = discover(str(root))
    assert [a.pci.address for a in topo.accelerators] == [
        "0000:15:00.0", "0000:19:00.0", "0000:34:00.0", "0000:38:00.0",
        "0000:95:00.0", "0000:99:00.0", "0000:b4:00.0", "0000:b8:00.0"]
    assert {a.vendor for a in topo.accelerators} == {"NVIDIA"}  # not the ASPEED VGA at 00:1f.0
    assert [a.pci.numa_node for a in topo.accelerators] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(8)]
    assert [n.node for n in topo.numa_nodes] == [0, 1]
    assert topo.numa_nodes[1].cpus == "48-95"


def test_pcie_tree_of_a_gpu_behind_two_switch_levels(tmp_path_factory):
    root = fake.build(fake.server_8gpu_8nic, tmp_path_factory)
    gpu1 = discover(str(root)).accelerators[1].pci
    # read from the layout: rp 10:01.0 -> T0 (11:00.0, 12:04.0) -> sub-switch (17:00.0, 18:00.0)
    assert gpu1.host_bridge == "pci0000:10"
    assert gpu1.root_port == "0000:10:01.0"
    assert gpu1.switch_ports == ("0000:11:00.0", "0000:12:04.0", "0000:17:00.0", "0000:18:00.0")


def test_nic_netdevs_ports_and_numa(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    nics = discover(str(root)).nics
    assert [(n.name, n.pci.address, n.pci.numa_node, n.netdevs) for n in nics] == [
        ("mlx5_0", "0000:1a:00.0", 0, ("ens0f0np0",)),
        ("mlx5_1", "0000:3b:00.0", 0, ("ens1f0np0",)),
        ("mlx5_2", "0000:9c:00.0", 1, ("ens2f0np0",)),
        ("mlx5_3", "0000:bc:00.0", 1, ("ens3f0np0",))]
    assert nics[0].ports[0].state == "ACTIVE" and nics[0].ports[0].link_layer == "Ethernet"


def test_processing_accelerator_class_of_huawei(tmp_path_factory):
    root = fake.build(fake.server_16acc_4nic, tmp_path_factory)
    accs = discover(str(root)).accelerators
    assert len(accs) == 16
    assert {(a.vendor, a.pci_class) for a in accs} == {("Huawei", 0x120000)}


def test_intel_counts_only_with_accelerator_classes(tmp_path):
    fs = fake.FakeSysfs(tmp_path)
    hb = fs.host_bridge("pci0000:00")
    fs.gpu(hb, "0000:00:02.0", -1, vendor=fake.INTEL, pci_class=fake.CLASS_VGA)   # iGPU
    fs.gpu(hb, "0000:00:03.0", -1, vendor=fake.INTEL, pci_class=0x038000)         # GPU Max
    fs.function(hb, "0000:00:04.0", fake.INTEL, fake.CLASS_ETH, -1)                # a NIC
    assert [a.pci.address for a in discover(str(tmp_path)).accelerators] == ["0000:00:03.0"]


def test_nic_not_under_any_switch_sits_on_its_root_port(tmp_path_factory):
    root = fake.build(fake.server_nic_no_switch, tmp_path_factory)
    nic = discover(str(root)).nics[0].pci
    assert (nic.host_bridge, nic.root_port, nic.switch_ports) == ("pci0000:17", "0000:17:03.0", ())


def test_no_nic_is_reported_not_raised(tmp_path_factory):
    root = fake.build(fake.server_no_nic, tmp_path_factory)
    topo = discover(str(root))
    assert len(topo.accelerators) == 8 and topo.nics == []
    assert any("no RDMA NIC" in n and "class/infiniband" in n for n in topo.notes)


def test_soft_roce_is_placed_by_its_parent_netdev(tmp_path_factory):
    root = fake.build(fake.soft_roce_vm, tmp_path_factory)
    topo = discover(str(root))
    (nic,) = topo.nics
    assert (nic.name, nic.virtual, nic.netdevs, nic.pci.address) == ("rxe0", True, ("eth0",),
                                                                      "0000:00:03.0")
    assert topo.accelerators == []


def test_root_from_environment(tmp_path_factory, monkeypatch):
    root = fake.build(fake.server_1nic, tmp_path_factory)
    monkeypatch.setenv("DICOMM_SYSFS_ROOT", str(root))
    topo = discover()
    assert topo.sysfs_root == str(root) and [n.name for n in topo.nics] == ["mlx5_0"]


def test_missing_root_is_a_note(tmp_path):
    topo = discover(str(tmp_path / "absent"))
    assert topo.accelerators == [] and topo.nics == []
    assert "not a directory" in topo.notes[0]


def _has_candidate_devices() -> bool:
    """A coarse independent check: any display/processing-accelerator class, or any RDMA class."""
    classes = []
    for path in glob.glob("/sys/bus/pci/devices/*/class"):
        with open(path) as f:
            classes.append(f.read().strip())
    return os.path.isdir("/sys/class/infiniband") or any(
        c.startswith(("0x03", "0x12")) for c in classes)


def test_real_sysfs_does_not_crash():
    topo = discover("/sys")
    assert topo.sysfs_root == "/sys"
    if not _has_candidate_devices():  # a host like CI's: nothing to find, said clearly
        assert topo.accelerators == [] and topo.nics == []
        assert any("no accelerator" in n for n in topo.notes)
        assert any("no RDMA NIC" in n for n in topo.notes)
