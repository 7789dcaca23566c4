"""Smoke run of bench.heteropp_realrun: what it reports is checked against the model file and the training
itself, never speed."""
from __future__ import annotations

import json
import math

from bench.heteropp_realrun import SMOKE, main, write_hf


def _tensor_bytes(path) -> int:
    """Bytes of every tensor in a safetensors file, read by safetensors itself."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())


def test_realrun_smoke_reports_each_stage_and_checkpointing_leaves_training_alone(tmp_path):
    out = tmp_path / "rr.json"
    assert main(["--smoke", "--only", "load,save", "--steps", "4", "--save-every", "2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["command"].startswith("python -m bench.heteropp_realrun") and d["machine_before"]["nproc"] >= 1
    # the file's tensors, counted by safetensors: the stages of a plan split them
    total = _tensor_bytes(write_hf(tmp_path / "m", SMOKE) / "model.safetensors")
    ranks = d["load"]["ranks"]
    assert sorted(r["stage"] for r in ranks) == [0, 1] and {r["plan"] for r in ranks} == {"2 stages"}
    assert sum(r["shard_bytes"] for r in ranks) == total
    for r in ranks:
        assert 0 < r["idle_rss"] <= r["after_copy"]["VmHWM"] <= r["maxrss_after_step"]
    runs = d["runs"]
    assert set(runs) == {"none", "async", "sync"} and d["checkpoint_bytes"] > 0
    for v in runs.values():
        (r,) = v["rounds"]
        assert len(r["intervals_s"]) == 3 and all(math.isfinite(x) and x > 0 for x in (v["window_s"], v["cpu_s"]))
    # saving, in the background or not, changes nothing in what is trained
    assert len({v["rounds"][0]["final_loss"] for v in runs.values()}) == 1

