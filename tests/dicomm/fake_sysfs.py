"""Fake sysfs trees stand in for server topologies.

FakeSysfs writes real directories, attribute files and relative symlinks laid out as the kernel
does (devices/pciDDDD:BB/<root port>/<switch ports>/<device>, bus/pci/devices/*, class/infiniband/*,
class/net/*, devices/system/node/*), so discovery reads it exactly as it reads /sys. The server
functions at the bottom build whole machines; each docstring draws the physical layout that the
tests' hand-written expectations are read from.
"""
from __future__ import annotations

import os
from pathlib import Path

NVIDIA, HUAWEI, ASPEED, INTEL, MELLANOX = 0x10DE, 0x19E5, 0x1A03, 0x8086, 0x15B3
CLASS_3D, CLASS_VGA, CLASS_ACCEL = 0x030200, 0x030000, 0x120000
CLASS_BRIDGE, CLASS_ETH = 0x060400, 0x020000


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for d in ("devices", "bus/pci/devices", "class/net", "devices/system/node"):
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def _files(self, d: Path, **attrs: str) -> None:
        d.mkdir(parents=True, exist_ok=True)
        for name, value in attrs.items():
            (d / name).write_text(value + "\n")

    def numa_node(self, node: int, cpus: str) -> None:
        self._files(self.root / "devices/system/node" / f"node{node}", cpulist=cpus)

    def host_bridge(self, name: str) -> Path:
        """A root complex, e.g. 'pci0000:16'."""
        d = self.root / "devices" / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def function(self, parent: Path, address: str, vendor: int, pci_class: int, numa: int,
                 device: int = 0x1234) -> Path:
        """A PCI function under parent (host bridge or bridge), listed in bus/pci/devices."""
        d = parent / address
        self._files(d, vendor=f"0x{vendor:04x}", device=f"0x{device:04x}",
                    **{"class": f"0x{pci_class:06x}"}, numa_node=str(numa))
        self._link(self.root / "bus/pci/devices" / address, d)
        return d

    def bridge(self, parent: Path, address: str, numa: int) -> Path:
        return self.function(parent, address, INTEL, CLASS_BRIDGE, numa)

    def switch(self, parent: Path, upstream: str, downstream: list[str], numa: int) -> list[Path]:
        """A PCIe switch: its upstream port under parent, its downstream ports below that."""
        up = self.bridge(parent, upstream, numa)
        return [self.bridge(up, a, numa) for a in downstream]

    def gpu(self, parent: Path, address: str, numa: int, vendor: int = NVIDIA,
            pci_class: int = CLASS_3D) -> Path:
        return self.function(parent, address, vendor, pci_class, numa, device=0x20B0)

    def netdev(self, device: Path, name: str) -> None:
        net = device / "net" / name
        self._files(net, address="02:00:00:00:00:01")
        self._link(net / "device", device)
        self._link(self.root / "class/net" / name, net)

    def nic(self, parent: Path, address: str, numa: int, name: str, netdev: str | None,
            states: tuple[str, ...] = ("4: ACTIVE",)) -> Path:
        """An RDMA NIC: PCI function, infiniband/<name> with ports, netdev, class links."""
        d = self.function(parent, address, MELLANOX, CLASS_ETH, numa, device=0x101D)
        ib = d / "infiniband" / name
        ib.mkdir(parents=True)
        self._link(ib / "device", d)
        for port, state in enumerate(states, start=1):
            self._files(ib / "ports" / str(port), state=state, rate="200 Gb/sec (4X HDR)",
                        link_layer="Ethernet")
        self._link(self.root / "class/infiniband" / name, ib)
        if netdev:
            self.netdev(d, netdev)
        return d

    def soft_roce(self, name: str, parent_netdev: str) -> None:
        """A Soft-RoCE device: virtual, no device link, a `parent` file naming its netdev."""
        ib = self.root / "devices/virtual/infiniband" / name
        self._files(ib, parent=parent_netdev)
        self._files(ib / "ports/1", state="4: ACTIVE", rate="10 Gb/sec (1X QDR)",
                    link_layer="Ethernet")
        self._link(self.root / "class/infiniband" / name, ib)


def _two_numa(fs: FakeSysfs) -> None:
    fs.numa_node(0, "0-47")
    fs.numa_node(1, "48-95")


def server_8gpu_8nic(root: Path) -> FakeSysfs:
    """8 GPUs, 8 NICs, 2 NUMA nodes, 4 PCIe switches (each with two second-level switches).

    NUMA n (n = 0, 1) has host bridge H_n with two root ports; each root port leads to a top
    switch T; each T has two second-level switches, each holding one GPU and one NIC:
      H0 (pci0000:10): rp 10:01.0 -> T0 -> [GPU0 + mlx5_0], [GPU1 + mlx5_1]
                       rp 10:03.0 -> T1 -> [GPU2 + mlx5_2], [GPU3 + mlx5_3]
      H1 (pci0000:90): rp 90:01.0 -> T2 -> [GPU4 + mlx5_4], [GPU5 + mlx5_5]
                       rp 90:03.0 -> T3 -> [GPU6 + mlx5_6], [GPU7 + mlx5_7]
    Plus the BMC's ASPEED VGA chip on H0, which is not an accelerator.
    """
    fs = FakeSysfs(root)
    _two_numa(fs)
    k = 0
    for numa, hb_bus in ((0, 0x10), (1, 0x90)):
        hb = fs.host_bridge(f"pci0000:{hb_bus:02x}")
        for rp_dev, base in ((0x01, hb_bus + 0x01), (0x03, hb_bus + 0x20)):
            rp = fs.bridge(hb, f"0000:{hb_bus:02x}:{rp_dev:02x}.0", numa)
            tops = fs.switch(rp, f"0000:{base:02x}:00.0",
                             [f"0000:{base + 1:02x}:00.0", f"0000:{base + 1:02x}:04.0"], numa)
            for j, top_down in enumerate(tops):
                sub = base + 2 + 4 * j
                gdown, ndown = fs.switch(top_down, f"0000:{sub:02x}:00.0",
                                         [f"0000:{sub + 1:02x}:00.0", f"0000:{sub + 1:02x}:04.0"],
                                         numa)
                fs.gpu(gdown, f"0000:{sub + 2:02x}:00.0", numa)
                fs.nic(ndown, f"0000:{sub + 3:02x}:00.0", numa, f"mlx5_{k}", f"ibp{sub + 3}s0")
                k += 1
    fs.gpu(fs.host_bridge("pci0000:00"), "0000:00:1f.0", 0, vendor=ASPEED, pci_class=CLASS_VGA)
    return fs


def server_8gpu_4nic(root: Path) -> FakeSysfs:
    """8 GPUs, 4 NICs (2 GPUs per NIC), 2 NUMA nodes, one switch per host bridge.

      NUMA 0: pci0000:15 -> rp 15:01.0 -> S0 {GPU0, GPU1, mlx5_0}
              pci0000:36 -> rp 36:01.0 -> S1 {GPU2, GPU3, mlx5_1}
      NUMA 1: pci0000:97 -> rp 97:01.0 -> S2 {GPU4, GPU5, mlx5_2}
              pci0000:b7 -> rp b7:01.0 -> S3 {GPU6, GPU7, mlx5_3}
    """
    fs = FakeSysfs(root)
    _two_numa(fs)
    for k, (numa, b) in enumerate(((0, 0x15), (0, 0x36), (1, 0x97), (1, 0xB7))):
        hb = fs.host_bridge(f"pci0000:{b:02x}")
        rp = fs.bridge(hb, f"0000:{b:02x}:01.0", numa)
        d = fs.switch(rp, f"0000:{b + 1:02x}:00.0",
                      [f"0000:{b + 2:02x}:{i:02x}.0" for i in range(3)], numa)
        fs.gpu(d[0], f"0000:{b + 3:02x}:00.0", numa)
        fs.gpu(d[1], f"0000:{b + 4:02x}:00.0", numa)
        fs.nic(d[2], f"0000:{b + 5:02x}:00.0", numa, f"mlx5_{k}", f"ens{k}f0np0")
    return fs


def server_16acc_4nic(root: Path) -> FakeSysfs:
    """16 processing accelerators (Huawei, class 0x1200), 4 NICs, 2 NUMA nodes.

    Each NUMA node has one host bridge, one root port and one switch holding 8 accelerators and
    2 NICs, so each accelerator has two equally close (PIX) NICs:
      NUMA 0: pci0000:00 -> rp 00:02.0 -> S0 {acc0..acc7,  mlx5_0, mlx5_1}
      NUMA 1: pci0000:80 -> rp 80:02.0 -> S1 {acc8..acc15, mlx5_2, mlx5_3}
    """
    fs = FakeSysfs(root)
    _two_numa(fs)
    for numa, b in ((0, 0x00), (1, 0x80)):
        hb = fs.host_bridge(f"pci0000:{b:02x}")
        rp = fs.bridge(hb, f"0000:{b:02x}:02.0", numa)
        d = fs.switch(rp, f"0000:{b + 1:02x}:00.0",
                      [f"0000:{b + 2:02x}:{i:02x}.0" for i in range(10)], numa)
        for i in range(8):
            fs.gpu(d[i], f"0000:{b + 3 + i:02x}:00.0", numa, vendor=HUAWEI, pci_class=CLASS_ACCEL)
        for j in range(2):
            fs.nic(d[8 + j], f"0000:{b + 0x10 + j:02x}:00.0", numa, f"mlx5_{2 * numa + j}",
                   f"eth{2 * numa + j}")
    return fs


def _gpus_on_switches(fs: FakeSysfs) -> dict[str, Path]:
    """8 GPUs: two switches per NUMA node, each on its own root port, 2 GPUs per switch.

      NUMA 0: pci0000:17 -> rp 17:01.0 -> S0 {GPU0, GPU1, spare port}
                            rp 17:02.0 -> S1 {GPU2, GPU3, spare port}
                            rp 17:03.0 (empty root port)
      NUMA 1: pci0000:97 -> rp 97:01.0 -> S2 {GPU4, GPU5}, rp 97:02.0 -> S3 {GPU6, GPU7}
    Returns the spare downstream port of S0 and the empty root port of pci0000:17.
    """
    _two_numa(fs)
    spare: dict[str, Path] = {}
    for numa, b in ((0, 0x17), (1, 0x97)):
        hb = fs.host_bridge(f"pci0000:{b:02x}")
        for j in range(2):
            rp = fs.bridge(hb, f"0000:{b:02x}:{j + 1:02x}.0", numa)
            bus = b + 1 + 0x10 * j
            d = fs.switch(rp, f"0000:{bus:02x}:00.0",
                          [f"0000:{bus + 1:02x}:{i:02x}.0" for i in range(3)], numa)
            fs.gpu(d[0], f"0000:{bus + 2:02x}:00.0", numa)
            fs.gpu(d[1], f"0000:{bus + 3:02x}:00.0", numa)
            if numa == 0 and j == 0:
                spare["switch0"] = d[2]
        if numa == 0:
            spare["root_port"] = fs.bridge(hb, f"0000:{b:02x}:03.0", numa)
    return spare


def server_1nic(root: Path) -> FakeSysfs:
    """8 GPUs as in _gpus_on_switches, one NIC (mlx5_0, 0000:1c:00.0) on S0's spare port."""
    fs = FakeSysfs(root)
    spare = _gpus_on_switches(fs)
    fs.nic(spare["switch0"], "0000:1c:00.0", 0, "mlx5_0", "ens1np0")
    return fs


def server_no_nic(root: Path) -> FakeSysfs:
    """8 GPUs as in _gpus_on_switches and no RDMA NIC (no class/infiniband at all)."""
    fs = FakeSysfs(root)
    _gpus_on_switches(fs)
    return fs


def server_nic_no_switch(root: Path) -> FakeSysfs:
    """8 GPUs as in _gpus_on_switches, one NIC (mlx5_0) directly on root port 17:03.0."""
    fs = FakeSysfs(root)
    spare = _gpus_on_switches(fs)
    fs.nic(spare["root_port"], "0000:40:00.0", 0, "mlx5_0", "ens3np0")
    return fs


def soft_roce_vm(root: Path) -> FakeSysfs:
    """A virtual machine: no accelerator, virtio-net eth0 at 0000:00:03.0, Soft-RoCE rxe0 on it."""
    fs = FakeSysfs(root)
    fs.numa_node(0, "0-1")
    hb = fs.host_bridge("pci0000:00")
    virtio = fs.function(hb, "0000:00:03.0", 0x1AF4, 0x020000, -1, device=0x1000)
    net = virtio / "virtio2" / "net" / "eth0"
    net.mkdir(parents=True)
    fs._link(net / "device", virtio / "virtio2")
    fs._link(fs.root / "class/net/eth0", net)
    fs.soft_roce("rxe0", "eth0")
    return fs


_BUILT: dict[str, Path] = {}


def build(server, tmp_path_factory) -> Path:
    """The root of a server's tree, built once per test session (the tests only read it)."""
    name = server.__name__
    if name not in _BUILT:
        root = tmp_path_factory.mktemp(name)
        server(root)
        _BUILT[name] = root
    return _BUILT[name]
