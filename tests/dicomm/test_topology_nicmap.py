"""DICOMM_NIC_MAP overrides. Fake sysfs trees stand in for server topologies."""
from __future__ import annotations

import pytest

from dicomm.topology import TopologyError, assign, discover, parse_nic_map, select_nic
from tests.dicomm import fake_sysfs as fake


def test_both_formats_parse_the_same():
    assert parse_nic_map('{"0": "mlx5_1", "3": "mlx5_0"}') == {0: "mlx5_1", 3: "mlx5_0"}
    assert parse_nic_map("0:mlx5_1, 3:mlx5_0") == {0: "mlx5_1", 3: "mlx5_0"}
    assert parse_nic_map("  ") == {}


@pytest.mark.parametrize("text, words", [
    ("0=mlx5_0", ["'0=mlx5_0'", "rank:nic"]),
    ("x:mlx5_0", ["'x'", "non-negative integer"]),
    ("0:mlx5_0,0:mlx5_1", ["local rank 0 twice"]),
    ('{"0": 5}', ["local rank 0 maps to 5"]),
    ('{"0": "mlx5_0"', ["not valid JSON"]),
    ('["mlx5_0"]', ["JSON object"]),
])
def test_malformed_maps_name_the_bad_part(text, words):
    with pytest.raises(TopologyError) as e:
        parse_nic_map(text)
    for w in words:
        assert w in str(e.value)


def test_override_is_used_and_flagged(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    c = select_nic(0, sysfs_root=str(root), env={"DICOMM_NIC_MAP": "0:mlx5_3"})
    assert (c.nic, c.path, c.affinity, c.overridden) == ("mlx5_3", "SYS", False, True)
    assert "set by DICOMM_NIC_MAP" in c.reason and "closest would be mlx5_0 (PIX)" in c.reason


def test_override_load_counts_for_the_other_ranks(tmp_path_factory):
    root = fake.build(fake.server_16acc_4nic, tmp_path_factory)
    result = assign(discover(str(root)), {"DICOMM_NIC_MAP": '{"0": "mlx5_1"}'})
    # rank 0 pinned to mlx5_1; the other seven ranks of switch 0 fill mlx5_0 first: 4 and 4
    assert [c.nic for c in result.choices[:8]] == ["mlx5_1", "mlx5_0", "mlx5_0", "mlx5_1",
                                                   "mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"]


def test_unknown_nic_is_named_with_the_ones_found(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    with pytest.raises(TopologyError) as e:
        select_nic(0, sysfs_root=str(root), env={"DICOMM_NIC_MAP": "1:mlx5_9"})
    msg = str(e.value)
    assert "local rank 1" in msg and "'mlx5_9'" in msg and "mlx5_0, mlx5_1, mlx5_2, mlx5_3" in msg


def test_unknown_rank_is_named_with_the_valid_range(tmp_path_factory):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    with pytest.raises(TopologyError, match=r"local rank 8, but this node has 8 .*0-7"):
        select_nic(0, sysfs_root=str(root), env={"DICOMM_NIC_MAP": "8:mlx5_0"})


def test_override_for_a_rank_without_accelerator(tmp_path_factory):
    root = fake.build(fake.soft_roce_vm, tmp_path_factory)
    c = select_nic(3, sysfs_root=str(root), env={"DICOMM_NIC_MAP": "3:rxe0"})
    assert (c.nic, c.overridden) == ("rxe0", True) and "set by DICOMM_NIC_MAP" in c.reason
