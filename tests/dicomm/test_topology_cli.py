"""dicomm-topo, run in-process. Fake sysfs trees stand in for server topologies."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from dicomm import topo_cli
from dicomm.topology.visible import VISIBLE_ENV
from tests.dicomm import fake_sysfs as fake

PACKAGE = Path(topo_cli.__file__).parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """The CLI reads os.environ: drop settings of the machine running the tests."""
    names = [v for vs in VISIBLE_ENV.values() for v in vs]
    for var in ["DICOMM_NIC_MAP", "DICOMM_SYSFS_ROOT", *names]:
        monkeypatch.delenv(var, raising=False)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = topo_cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_text_shows_devices_matrix_and_assignment(tmp_path_factory, capsys):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    rc, out, _ = _run(capsys, "--sysfs-root", str(root))
    assert rc == 0
    assert "Accelerators (8, PCI bus order)" in out and "RDMA NICs (4)" in out
    lines = out.splitlines()
    row = next(line for line in lines if line.strip().startswith("acc2 "))
    assert row.split() == ["acc2", "NODE", "PIX", "SYS", "SYS"]
    rank7 = next(line for line in lines if line.strip().startswith("7 ") and "mlx5" in line)
    assert rank7.split()[:6] == ["7", "0000:bb:00.0", "mlx5_3", "ens3f0np0", "PIX", "yes"]


def test_json_has_the_same_content(tmp_path_factory, capsys):
    root = fake.build(fake.server_1nic, tmp_path_factory)
    rc, out, _ = _run(capsys, "--sysfs-root", str(root), "--json")
    data = json.loads(out)
    assert rc == 0 and len(data["accelerators"]) == 8 and data["nics"][0]["name"] == "mlx5_0"
    assert [r["paths"] for r in data["matrix"]["rows"]] == [["PIX"]] * 2 + [["PHB"]] * 2 + \
        [["SYS"]] * 4
    assert [(a["nic"], a["affinity"]) for a in data["assignment"]] == \
        [("mlx5_0", True)] * 2 + [("mlx5_0", False)] * 6
    assert data["nics"][0]["switch_ports"] == ["0000:18:00.0", "0000:19:02.0"]


def test_local_rank_shows_one_rank(tmp_path_factory, capsys):
    root = fake.build(fake.server_nic_no_switch, tmp_path_factory)
    _, out, _ = _run(capsys, "--sysfs-root", str(root), "--json", "--local-rank", "4")
    (only,) = json.loads(out)["assignment"]
    assert (only["local_rank"], only["nic"], only["path"], only["affinity"]) == (
        4, "mlx5_0", "SYS", False)


def test_bad_nic_map_exits_2_with_the_reason(tmp_path_factory, capsys, monkeypatch):
    root = fake.build(fake.server_8gpu_4nic, tmp_path_factory)
    monkeypatch.setenv("DICOMM_NIC_MAP", "0:mlx5_7")
    rc, out, err = _run(capsys, "--sysfs-root", str(root))
    assert rc == 2 and out == "" and "'mlx5_7'" in err and err.startswith("dicomm-topo: error:")


def test_empty_host_is_reported_clearly(capsys):
    rc, out, _ = _run(capsys, "--sysfs-root", "/sys")
    assert rc == 0 and "Accelerators (" in out and "RDMA NICs (" in out


def test_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        topo_cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for opt in ("--sysfs-root", "--json", "--local-rank"):
        assert opt in out


def test_topology_code_imports_no_torch():
    """The CLI must start fast: nothing in dicomm.topology or topo_cli may import torch."""
    files = [*sorted((PACKAGE / "topology").glob("*.py")), PACKAGE / "topo_cli.py"]
    assert len(files) >= 5
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] != "torch", f"{f.name} imports {name}"
                assert not name.startswith("dicomm") or name.startswith("dicomm.topology"), \
                    f"{f.name} imports {name}, which loads the engine"
