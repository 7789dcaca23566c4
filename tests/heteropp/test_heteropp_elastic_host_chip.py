"""An elastic worker started without --chip or HETEROPP_CHIP takes its host's chip type from the ditorch vendor
the host selects (DITORCH_VENDOR, else the first available; node_gather.host_vendor): the one chip type of the
run's cluster spec whose vendor (its `device`, the config's chip_map overriding) is that vendor
(heteropp/engine/elastic.host_chip). None or several such types: a clear error naming the candidates and the
host's vendor. The expected types are read off the cluster specs by hand; one real worker (DITORCH_VENDOR=diopi,
one rank, no --chip) trains the type that maps to DIOPI."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.elastic import host_chip
from heteropp.spec import PRESETS, cluster_from_dict
from heteropp.spec.errors import SpecError
from heteropp.spec.io import load_mapping

REPO = Path(__file__).resolve().parents[2]
GPU_CPU = REPO / "examples/clusters/gpu-cpu.yaml"  # gpu: device cuda, host: device cpu
TWO_CPU = REPO / "examples/clusters/two-cpu.yaml"  # big and small: no device, so both cpu


def _cluster(path: Path):
    return cluster_from_dict(load_mapping(str(path)), str(path))


@pytest.mark.parametrize("spec, chip_map, vendor, want", [
    (GPU_CPU, {}, "cpu", "host"),  # the spec's devices alone
    (TWO_CPU, {"small": "diopi"}, "diopi", "small"),  # the chip map gives one type another vendor...
    (TWO_CPU, {"small": "diopi"}, "cpu", "big"),  # ...leaving the other alone on the CPU
    (GPU_CPU, {"gpu": "diopi"}, "diopi", "gpu"),  # the chip map overrides the spec's device
])
def test_the_one_chip_type_of_the_hosts_vendor_is_chosen(spec, chip_map, vendor, want) -> None:
    assert host_chip(_cluster(spec), chip_map, vendor) == want


def test_a_device_given_in_the_cluster_spec_alone_decides(tmp_path) -> None:
    spec = load_mapping(str(TWO_CPU))
    spec["chips"][0]["device"] = "diopi"
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(spec))
    assert host_chip(_cluster(path), {}, "diopi") == "big"


def test_several_chip_types_of_the_hosts_vendor_are_an_error_naming_them_and_the_vendor() -> None:
    with pytest.raises(SpecError) as e:
        host_chip(_cluster(TWO_CPU), {}, "cpu")
    msg = str(e.value)
    assert "'cpu'" in msg and "big" in msg and "small" in msg and "--chip" in msg and "HETEROPP_CHIP" in msg


def test_no_chip_type_of_the_hosts_vendor_is_an_error_naming_the_types_vendors() -> None:
    with pytest.raises(SpecError) as e:
        host_chip(_cluster(GPU_CPU), {}, "diopi")
    msg = str(e.value)
    assert "'diopi'" in msg and "gpu (cuda)" in msg and "host (cpu)" in msg and "--chip" in msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_rank_config(tmp: Path) -> Path:
    plan = {"version": 2, "stages": [{"chip": "small", "tp": 1, "layers": 8}], "dp": 1, "micro_batch_size": 1,
            "micro_batches": 2}
    cfg = RunConfig(plan=plan, model=RunConfig.model_dict(PRESETS["tiny"]), steps=1, backend="gloo", timeout_s=60,
                    chip_map={"small": "diopi"}, options={"checkpoint_dir": str(tmp / "ck")})
    path = tmp / "run.json"
    path.write_text(json.dumps({**cfg.__dict__, "elastic": {
        "cluster": load_mapping(str(TWO_CPU)), "train": {"global_batch": 2, "micro_batch_size": 1}}}))
    return path


def _worker(tmp: Path, vendor: str) -> subprocess.CompletedProcess:
    """One elastic rank (a world of one) on a host whose DITORCH_VENDOR is `vendor`, without --chip."""
    env = {k: v for k, v in os.environ.items() if k not in ("HETEROPP_CHIP", "DIOPI_LIBRARY")}
    env.update(DITORCH_VENDOR=vendor, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "heteropp.engine.elastic", "--config", str(_one_rank_config(tmp))],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_worker_without_a_chip_type_trains_the_type_of_its_hosts_vendor(tmp_path) -> None:
    """DITORCH_VENDOR=diopi, chip map {small: diopi}: the worker says it took `small` and why, and the round
    it plans is one `small` chip (before: 'give this host's chip type')."""
    r = _worker(tmp_path, "diopi")
    assert r.returncode == 0, r.stderr[-3000:]
    said = [x for x in r.stdout.splitlines() if "chip type" in x]
    assert len(said) == 1 and "'small'" in said[0] and "'diopi'" in said[0], r.stdout
    rounds = [json.loads(x) for x in (tmp_path / "ck/elastic.jsonl").read_text().splitlines()]
    assert [e["chips"] for e in rounds if e["event"] == "round"] == [{"small": 1}]
    assert rounds[-1]["event"] == "finished"


def test_a_worker_whose_vendor_fits_several_types_exits_2_naming_them(tmp_path) -> None:
    """DITORCH_VENDOR=cpu and no chip map: big and small both run on the CPU (the spec gives no device), so the
    worker cannot tell which it is: exit 2 naming both and the vendor, no traceback."""
    cfg = json.loads(_one_rank_config(tmp_path).read_text())
    (tmp_path / "run.json").write_text(json.dumps({**cfg, "chip_map": {}}))
    env = {k: v for k, v in os.environ.items() if k != "HETEROPP_CHIP"}
    r = subprocess.run([sys.executable, "-m", "heteropp.engine.elastic", "--config", str(tmp_path / "run.json")],
                       env={**env, "DITORCH_VENDOR": "cpu"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "'cpu'" in r.stderr and "big, small" in r.stderr and "HETEROPP_CHIP" in r.stderr, r.stderr
