"""NIC assignment per local rank. Fake sysfs trees stand in for server topologies; expected NICs
and path classes are written by hand from each fake server's drawn layout."""
from __future__ import annotations

import pytest

from dicomm.topology import assign, discover, select_nic
from tests.dicomm import fake_sysfs as fake


def _table(root, env=None) -> list[tuple[str | None, str | None, bool]]:
    result = assign(discover(str(root)), env or {})
    return [(c.nic, c.path, c.affinity) for c in result.choices]


def test_8gpu_8nic_each_gpu_gets_its_own_switch_nic(tmp_path_factory):
    root = fake.build(fake.server_8gpu_8nic, tmp_path_factory)
    assert _table(root) == [(f"mlx5_{i}", "PIX", True) for i in range(8)]


def test_8gpu_4nic_two_gpus_per_nic(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    assert [nic for nic, _, _ in _table(root)] == [
        "mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"]
    assert {(p, a) for _, p, a in _table(root)} == {("PIX", True)}


def test_16acc_4nic_ties_spread_evenly(tmp_path_factory):
    root = fake.build(fake.server_16acc_4nic, tmp_path_factory)
    table = _table(root)
    # two PIX NICs per switch of 8: alternate, least-loaded first, PCI order breaks equal loads
    assert [nic for nic, _, _ in table] == ["mlx5_0", "mlx5_1"] * 4 + ["mlx5_2", "mlx5_3"] * 4
    assert {(p, a) for _, p, a in table} == {("PIX", True)}
    reason = assign(discover(str(root)), {}).choices[0].reason
    assert "tied at PIX with mlx5_1" in reason and "local ranks 0, 2, 4, 6" in reason


def test_1nic_non_affinity_ranks_say_why(tmp_path_factory):
    root = fake.build(fake.server_1nic, tmp_path_factory)
    assert _table(root) == [("mlx5_0", "PIX", True)] * 2 + [("mlx5_0", "PHB", False)] * 2 + \
        [("mlx5_0", "SYS", False)] * 4
    choice = select_nic(5, sysfs_root=str(root), env={})
    assert "different NUMA nodes (1 and 0)" in choice.reason
    assert "no usable NIC shares a PCIe switch" in choice.reason
    assert "non-affinity NIC" in choice.describe()


def test_nic_without_switch(tmp_path_factory):
    root = fake.build(fake.server_nic_no_switch, tmp_path_factory)
    assert _table(root) == [("mlx5_0", "PHB", False)] * 4 + [("mlx5_0", "SYS", False)] * 4
    assert "root ports (0000:17:01.0, 0000:17:03.0)" in select_nic(0, str(root), {}).reason


def test_no_nic_gives_an_empty_choice_with_the_reason(tmp_path_factory):
    root = fake.build(fake.server_no_nic, tmp_path_factory)
    choice = select_nic(3, sysfs_root=str(root), env={})
    assert (choice.nic, choice.netdev, choice.path, choice.affinity) == (None, None, None, False)
    assert choice.accelerator == "0000:2b:00.0"
    assert "no RDMA NIC under" in choice.reason


def test_select_nic_fields_and_env_root(tmp_path_factory, monkeypatch):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    monkeypatch.setenv("DICOMM_SYSFS_ROOT", str(root))
    monkeypatch.delenv("DICOMM_NIC_MAP", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    c = select_nic(2)
    assert (c.local_rank, c.nic, c.netdev, c.path, c.affinity, c.accelerator, c.overridden) == (
        2, "mlx5_1", "ens1f0np0", "PIX", True, "0000:39:00.0", False)
    assert c.describe().startswith("local rank 2: mlx5_1 (ens1f0np0), PIX, affinity NIC: ")


def test_rank_without_accelerator_round_robin_and_says_so(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    c = select_nic(9, sysfs_root=str(root), env={})
    assert (c.nic, c.path, c.affinity) == ("mlx5_1", None, False)  # 9 % 4 NICs
    assert "has no accelerator (8 found)" in c.reason and "round-robin" in c.reason


def test_soft_roce_vm_cpu_rank(tmp_path_factory):
    root = fake.build(fake.soft_roce_vm, tmp_path_factory)
    c = select_nic(0, sysfs_root=str(root), env={})
    assert (c.nic, c.netdev, c.affinity) == ("rxe0", "eth0", False)


def test_visible_devices_list_picks_accelerators_and_spreads_over_them(tmp_path_factory):
    root = fake.build(fake.server_16acc_4nic, tmp_path_factory)
    env = {"ASCEND_RT_VISIBLE_DEVICES": "0,2,4,6"}
    result = assign(discover(str(root)), env)
    # ranks drive acc 0,2,4,6 (one switch, NICs mlx5_0/1 tied): spread over these four ranks
    assert [(c.accelerator, c.nic) for c in result.choices] == [
        ("0000:03:00.0", "mlx5_0"), ("0000:05:00.0", "mlx5_1"),
        ("0000:07:00.0", "mlx5_0"), ("0000:09:00.0", "mlx5_1")]
    assert "ASCEND_RT_VISIBLE_DEVICES=0,2,4,6" in result.ranks.how


def test_visible_devices_single_entry_means_one_device_per_process(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    c = select_nic(0, sysfs_root=str(root), env={"CUDA_VISIBLE_DEVICES": "6"})
    assert (c.local_rank, c.accelerator, c.nic) == (0, "0000:ba:00.0", "mlx5_3")


def test_visible_devices_uuids_are_ignored_with_a_reason(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    result = assign(discover(str(root)), {"CUDA_VISIBLE_DEVICES": "GPU-1234"})
    assert "not indices; ignored" in result.ranks.how
    assert result.choices[7].accelerator == "0000:bb:00.0"


def test_down_nic_is_skipped_and_named(tmp_path):
    fs = fake.FakeSysfs(tmp_path)
    hb = fs.host_bridge("pci0000:00")
    rp = fs.bridge(hb, "0000:00:01.0", 0)
    d = fs.switch(rp, "0000:01:00.0", ["0000:02:00.0", "0000:02:01.0"], 0)
    fs.gpu(d[0], "0000:03:00.0", 0)
    fs.nic(d[1], "0000:04:00.0", 0, "mlx5_0", "eth0", states=("1: DOWN",))
    fs.nic(fs.bridge(hb, "0000:00:02.0", 0), "0000:05:00.0", 0, "mlx5_1", "eth1")
    c = select_nic(0, sysfs_root=str(tmp_path), env={})
    assert (c.nic, c.path, c.affinity) == ("mlx5_1", "PHB", False)
    assert "skipped mlx5_0 (no port ACTIVE)" in c.reason


def test_negative_rank_is_refused(tmp_path_factory):
    root = fake.build(fake.server_1nic, tmp_path_factory)
    with pytest.raises(ValueError, match="local rank must be >= 0"):
        select_nic(-1, sysfs_root=str(root), env={})
