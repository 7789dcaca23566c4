"""The HARP Setting 1 example plans against numbers computed by hand from the spec files, not against the
planner's own earlier output.

HARP Setting 1 (HARP, arXiv 2509.24859: 4 nodes x 8 A100 and 4 nodes x 8 V100e,
the two clusters joined by a 5 Gbps link) trains a GPT of 1.3B parameters with one sequence per
micro-batch. Every plan that uses both clusters sends each micro-batch's activation (fp16, seq x hidden)
across that link once forward and its gradient once back, so the link's forward channel alone needs
b x bytes / bandwidth per iteration: no plan can be faster. HARP's H-1F1B exists to keep the link busy
(extra warm-up hides the round trips), so its plan should come close to that floor, and be faster than
the 1F1B plan, which waits for round trips across the link (HARP's reported direction)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from heteropp.auto.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"
SPECS = ["--cluster", str(EX / "clusters/harp.yaml"), "--model", str(EX / "models/gpt-harp.yaml")]
PLANS = {"1f1b": ("harp-setting-1.json", "harp.yaml"), "h1f1b": ("harp-setting-1-h1f1b.json", "harp-h1f1b.yaml")}
H1F1B_SLACK = 1.10  # H-1F1B keeps the link busy at least 1 / 1.10 of the iteration


def link_floor_s(train_file: str) -> float:
    """b x one activation's bytes over the cross-cluster link, from the spec files alone."""
    cluster = yaml.safe_load((EX / "clusters/harp.yaml").read_text())
    model = yaml.safe_load((EX / "models/gpt-harp.yaml").read_text())
    train = yaml.safe_load((EX / "training" / train_file).read_text())
    (link,) = cluster["links"]
    assert link["bandwidth"] == "5Gbps"
    bytes_per_value = {"fp16": 2, "bf16": 2, "fp32": 4}[train["dtype"]]
    activation = bytes_per_value * train["micro_batch_size"] * model["seq_len"] * model["hidden"]
    micro_batches = train["global_batch"] // train["micro_batch_size"]  # one pipeline: dp 1 (checked below)
    return micro_batches * activation / (5e9 / 8)


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, dict]:
    """The plan the planner writes now for each example's spec files (the README's command), per schedule."""
    out = {}
    for schedule, (_, train) in PLANS.items():
        path = tmp_path_factory.mktemp("plans") / f"{train}.json"
        assert main(["plan", *SPECS, "--train", str(EX / "training" / train), "--json", str(path),
                     "--no-progress"]) == 0
        out[schedule] = json.loads(path.read_text())
    return out


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_harp_plans_respect_the_link_floor_and_cross_the_link_once(planned, schedule):
    plan_file, train = PLANS[schedule]
    floor = link_floor_s(train)
    for plan in (json.loads((EX / "plans" / plan_file).read_text()), planned[schedule]):
        assert plan["dp"] == 1 and plan["schedule"] == schedule
        chips = [s["chip"] for s in plan["stages"]]
        # one crossing of the slow link: two runs of one chip type each (either may come first; under
        # H-1F1B the warm-up chosen per plan can favour either order)
        assert len(set(chips)) == 2 and sum(a != b for a, b in zip(chips, chips[1:])) == 1, chips
        assert plan["iteration_time_s"] >= floor
        if schedule == "h1f1b":
            assert plan["iteration_time_s"] <= floor * H1F1B_SLACK, (plan["iteration_time_s"], floor)


def test_harp_h1f1b_beats_1f1b_on_the_slow_link(planned):
    assert planned["h1f1b"]["iteration_time_s"] < planned["1f1b"]["iteration_time_s"]


def _same(a: object, b: object, where: str = "plan") -> None:
    """a == b, floats to 1e-9 relative (another machine's libm may differ in the last bits)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (where, sorted(a.keys() ^ b.keys()))
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_committed_example_plans_are_what_the_planner_writes(planned, schedule):
    """A committed example plan is the planner's output for its spec files, field by field except the
    search time (regenerate it with the README's command when the planner changes)."""
    committed = json.loads((EX / "plans" / PLANS[schedule][0]).read_text())
    now = dict(planned[schedule])
    assert committed.pop("search_time_s") >= 0 and now.pop("search_time_s") >= 0
    _same(now, committed)


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_committed_example_plans_simulate_to_their_stated_time(tmp_path, schedule):
    plan_file, train = PLANS[schedule]
    committed = json.loads((EX / "plans" / plan_file).read_text())
    sim = tmp_path / "sim.json"
    assert main(["simulate", str(EX / "plans" / plan_file), *SPECS, "--train", str(EX / "training" / train),
                 "--json", str(sim)]) == 0
    assert json.loads(sim.read_text())["iteration_time_s"] == pytest.approx(committed["iteration_time_s"], rel=1e-9)


# What a paper states of a plan: the fields a transcribed peer plan carries (examples/README.md, "Peer plans").
TRANSCRIBED_STAGE = ("chip", "tp", "layers", "recompute", "inner_dp")
TRANSCRIBED_TOP = ("dp", "micro_batches", "micro_batch_size", "schedule", "schedule_params")


def _simulate_transcribed(tmp_path: Path, committed: dict, train: str, keep: tuple[str, ...]) -> dict:
    cut = {k: committed[k] for k in keep}
    cut["stages"] = [{k: s[k] for k in TRANSCRIBED_STAGE} for s in committed["stages"]]
    path, sim = tmp_path / "transcribed.json", tmp_path / "sim.json"
    path.write_text(json.dumps(cut))
    assert main(["simulate", str(path), *SPECS, "--train", str(EX / "training" / train), "--json", str(sim)]) == 0
    return json.loads(sim.read_text())


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_a_plan_cut_to_what_a_paper_states_simulates_like_the_planner_file(tmp_path, schedule):
    """The route a peer's published plan takes (README): only the fields a paper gives, simulated next to
    ours. Our own plans, cut down to them, simulate to the time in their files, so neither the planner's
    estimates nor its bookkeeping favour our plans over a transcribed one."""
    plan_file, train = PLANS[schedule]
    committed = json.loads((EX / "plans" / plan_file).read_text())
    out = _simulate_transcribed(tmp_path, committed, train, TRANSCRIBED_TOP)
    assert out["iteration_time_s"] == pytest.approx(committed["iteration_time_s"], rel=1e-9)


def test_h1f1b_plan_without_warmups_gets_harps_rule_and_ours_is_not_slower(tmp_path):
    """A transcribed H-1F1B plan that states no warm-ups gets HARP's own rule, ceil(2 e_j / (F + B) of the
    slowest stage) per boundary (computed here by hand from the plan file's per-boundary transfer and
    per-stage times); the planner's chosen warm-ups on the same layout are not slower than HARP's rule."""
    plan_file, train = PLANS["h1f1b"]
    committed = json.loads((EX / "plans" / plan_file).read_text())
    out = _simulate_transcribed(tmp_path, committed, train, tuple(k for k in TRANSCRIBED_TOP if k != "schedule_params"))
    bottleneck = max(s["est_time_s"] for s in committed["stages"])
    assert out["schedule_params"]["extra_warmup"] == [math.ceil(2 * e / bottleneck)
                                                      for e in committed["extra"]["boundary_s"]]
    assert committed["iteration_time_s"] <= out["iteration_time_s"] * (1 + 1e-9)
