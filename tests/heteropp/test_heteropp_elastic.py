"""Elastic training over emulated hosts: `heteropp run --elastic` starts one torch elastic agent (torchrun) per
host on this machine (processes over loopback stand in for two hosts of two chip types). One host is SIGKILLed
with its workers mid-run: the survivors' agent restarts them, they re-plan with HeteroAuto for the chips left,
resume from the newest checkpoint and go on; the host then comes back reading its chips as the other type and is
absorbed at the next round, re-planned with that type. Every rank's state is also held in memory by its host's
snapshot keeper and the other host's (a snapshot at each checkpoint's step here), so each new round resumes from
memory, the lost host's state from the other host's keeper. Each round's curve equals resuming the disk
checkpoint of the same step on its plan by hand, value for value, and the whole follows the uninterrupted
single-process reference within the paper's MRE of 1.5%."""
from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heteropp.engine import train_reference
from heteropp.engine.checkpoint import complete_checkpoints, read_trainer
from heteropp.engine.elastic import EXIT_PEER, EXIT_REPLAN, peer_error, verdict_line
from heteropp.engine.elastic_launch import kill_host
from heteropp.engine.quiet_agent import SaidElsewhere
from heteropp.plan import Plan
from heteropp.spec import PRESETS

from .elastic_run import ElasticRun

REPO = Path(__file__).resolve().parents[2]
# a run too long to end while the returned host starts (its agent imports torch: 10-30 s); the test stops it
# once round 3 has trained a few steps (the learning rate is constant: a longer run changes no step before)
STEPS, EVERY = 1000, 4


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _events(path)}


@pytest.mark.slow
def test_a_lost_host_is_replanned_around_and_comes_back_as_another_chip_type(tmp_path) -> None:
    run = ElasticRun(tmp_path, steps=STEPS, every=EVERY, snapshot_every=EVERY)
    run.wait_step(EVERY + 1)  # right after a save's next step: the worst moment for work lost
    killed_step = max(r["step"] for r in run.steps_logged())
    small = run.host("small")
    killed = run.kill(small)  # the host: its agent and its workers
    second = run.wait_round(killed)
    assert second["chips"] == {"big": 2} and second["started"] > killed
    assert EVERY <= second["resume_from"] <= killed_step and killed_step - second["resume_from"] <= EVERY
    # from the snapshot in memory (the lost host's part from the survivor's keeper), not the disk
    assert second["resume_source"] == "memory", second
    # its workers were forked by the host's warm process, not started afresh (importing torch)
    assert second["warm_start"], second
    resumed = next(e for e in run.events("resumed") if e["time"] > second["time"])
    assert resumed["source"] == "memory" and resumed["step"] == second["resume_from"]
    assert any(e["event"] == "peer_failure" and e["time"] >= killed for e in run.events())
    run.wait_step(second["resume_from"] + EVERY + 1, after=second["time"])
    back = run.restart(small, chip="big")  # the same host, its chips now read as `big`
    third = run.wait_round(back)
    last = third["resume_from"] + 3
    run.wait_step(last, after=third["time"])
    got = run.stop()
    assert sorted(got)[:last] == list(range(1, last + 1))
    assert [r["chips"] for r in run.rounds()] == [{"big": 2, "small": 2}, {"big": 2}, {"big": 4}]
    # what the user reads: a line a round (chips, plan, where it resumes), a line a rank that lost its peer, and
    # not torch elastic's own logs of the workers it saw fail
    out = run.output()
    assert "heteropp elastic: round 1 on big x2, small x2: " in out and "step 1 on, from the start" in out, out
    assert (f"heteropp elastic: round 2 on big x2: {'; '.join(second['plan'])}; step {second['resume_from'] + 1} "
            "on, from memory") in out, out
    lost = [x for x in out.splitlines() if "a peer is gone" in x]
    assert lost and all(x.startswith("heteropp elastic: world rank ") and "pair.cc" not in x for x in lost), out
    assert "torch/distributed/elastic" not in out, out  # the agents' glog-style lines name their source file
    assert third["resume_source"] == "memory", third
    assert {s.chip for s in Plan.load(run.ck / f"plan-round{second['round']}.json").stages} == {"big"}
    # the re-plan counted the returned chips as `big` (the cluster spec's numbers for that type)
    assert {s.chip for s in Plan.load(run.ck / f"plan-round{third['round']}.json").stages} == {"big"}
    run.check_by_hand(second, got, upto=third["resume_from"])
    run.check_by_hand(third, got, upto=last)
    want = train_reference(PRESETS["tiny"], last, 8, verbose=False)["losses"]
    mre = sum(abs(got[s] - w) / w for s, w in enumerate(want, 1)) / last
    assert mre < 0.015, mre


CRAMPED = """
name: cramped
chips:
  - {name: big, count: 2, memory_gb: 4, peak_tflops: 0.2, chips_per_node: 2, tp_max: 2, intra_node_bw: 5, network_bw: 2}
  - {name: small, count: 8, memory_gb: 0.002, peak_tflops: 0.1, chips_per_node: 2, tp_max: 2, intra_node_bw: 5,
     network_bw: 2}
"""


@pytest.mark.slow
def test_too_few_chips_left_is_an_error_naming_the_smallest_cluster_and_the_checkpoint_stays(tmp_path) -> None:
    cluster = tmp_path / "cramped.yaml"
    cluster.write_text(CRAMPED)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 2, "stages": [{"chip": "small", "tp": 2, "layers": 1},
                                                         {"chip": "big", "tp": 2, "layers": 7}],
                                "dp": 1, "micro_batch_size": 1, "micro_batches": 8, "schedule": "1f1b"}))
    ck, log = tmp_path / "ck", tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "heteropp", "run", "--elastic", "--plan", str(plan), "--model", "tiny",
         "--cluster", str(cluster), "--hosts", "big:2,small:2", "--max-restarts", "1", "--steps", "40",
         "--checkpoint-dir", str(ck), "--save-every", "2", "--loss-log", str(log), "--backend", "gloo",
         "--timeout", "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not complete_checkpoints(ck) or max(_losses(log), default=0) < 3:
            if proc.poll() is not None or time.time() > deadline:
                proc.terminate()
                raise AssertionError("the run ended or stalled before the failure:\n" + proc.communicate()[0][-4000:])
            time.sleep(0.1)
        big = next(e for e in _events(ck / "elastic.jsonl") if e["event"] == "host_started" and e["chip"] == "big")
        kill_host(big["pid"])
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert proc.returncode == 2, out[-3000:]
    assert "no plan fits the chips left ({'small': 2})" in out, out[-2000:]
    assert "the smallest cluster that fits: " in out, out[-2000:]
    smallest = out.split("the smallest cluster that fits: ")[-1].splitlines()[0]
    big_alone, small_alone = smallest.split(" or ")
    assert big_alone == "1 x big"  # one 4 GB chip holds the tiny model
    assert small_alone.endswith(" x small") and int(small_alone.split()[0]) > 2  # the 2 left did not
    newest = complete_checkpoints(ck)[-1]
    read_trainer(newest, PRESETS["tiny"])  # whole: every file's SHA-256 as written
    assert not any(p.name.endswith(".partial") for p in ck.iterdir() if p.name > newest.name)


def test_ranks_take_their_chip_types_places_in_the_plan_and_the_rest_stay_idle() -> None:
    from heteropp.engine.elastic import assign, live_cluster
    from heteropp.plan import StagePlan
    from heteropp.spec import load_cluster
    plan = Plan([StagePlan("big", 2, 5), StagePlan("small", 1, 3)], dp=1, micro_batch_size=1, micro_batches=4)
    chips = ["small", "small", "big", "big", "small"]  # world ranks by host, as the agents numbered them
    assert assign(plan, chips) == [2, 3, 0]  # ranks 1 and 4 idle
    cluster = live_cluster(load_cluster(REPO / "examples/clusters/two-cpu.yaml"), chips)
    assert {c.name: c.count for c in cluster.chips} == {"big": 2, "small": 3}


def test_the_multi_host_recipe_is_printed_with_the_round_scoped_store(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 1,
                                "micro_batch_size": 1, "micro_batches": 2}))
    r = subprocess.run([sys.executable, "-m", "heteropp", "run", "--elastic", "--plan", str(plan), "--model", "tiny",
                        "--cluster", str(REPO / "examples/clusters/two-cpu.yaml"), "--checkpoint-dir",
                        str(tmp_path / "ck"), "--write-config", str(tmp_path / "run.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.splitlines()[-1]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in cmd and "-m torch.distributed.run" in cmd
    assert f"-m heteropp.engine.elastic --config {tmp_path / 'run.json'} --chip <CHIP>" in cmd
    cfg = json.loads((tmp_path / "run.json").read_text())
    assert cfg["elastic"]["train"]["global_batch"] == 2 and cfg["elastic"]["cluster"]["name"] == "two-cpu"


def test_the_console_lines_of_a_lost_peer_and_of_a_straggler_verdict() -> None:
    # gloo's error as a survivor's receive reports it: the source location and the advice are dropped
    gloo = ("rank 2 (stage 1): receiving activation of micro-batch 1 from rank 0 failed: [/src/third_party/gloo/gloo/"
            "transport/tcp/pair.cc:537] Read error [127.0.0.1]:37275: Connection reset by peer. This is typically "
            "caused by a remote worker hanging or bugs in the application.")
    assert peer_error(RuntimeError(gloo)) == ("rank 2 (stage 1): receiving activation of micro-batch 1 from rank 0 "
                                              "failed: Read error [127.0.0.1]:37275: Connection reset by peer")
    assert peer_error(ConnectionResetError()) == "ConnectionResetError"
    verdict = {"stage": 0, "group": 1, "chip": "slow", "slowdown": 6.5234, "step": 9,
               "new_plan": ["fast tp1 x4", "dp 1"], "gain_s": 41.2, "steps_left": 31, "cost_s": 4.03, "replan": True}
    assert verdict_line(verdict, groups=True) == (
        "heteropp elastic: step 9: chip slow (group 1 stage 0) 6.52x slower than predicted, relative to the other "
        "stages; re-plan (gain 41.2 s over 31 steps, cost 4.03 s): this round ends, the next runs it")
    assert verdict_line({**verdict, "replan": False}, groups=False).endswith(
        "chip slow (stage 0) 6.52x slower than predicted, relative to the other stages; re-plan (gain 41.2 s over 31 "
        "steps, cost 4.03 s): not worth it, going on")
    assert verdict_line({**verdict, "new_plan": None, "replan": False}, groups=False).endswith(
        "re-plan: no plan for the chips at these speeds, going on")


def test_the_quiet_agent_drops_only_what_heteropps_lines_already_say() -> None:
    """torch elastic's records through a handler with the quiet agent's filter: a worker's exit with EXIT_PEER or
    EXIT_REPLAN (its line, or rank 0's verdict, said why) and the agent's warnings are dropped; a worker killed by
    a signal or ended with another code, and any other logger's warning, still reach the console."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(SaidElsewhere())
    mp = logging.getLogger("torch.distributed.elastic.multiprocessing.api.test")
    other = logging.getLogger("torch.distributed.distributed_c10d.test")
    for log in (mp, other):
        log.addHandler(handler)
        log.propagate = False
    try:
        failed = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
        for code in (EXIT_PEER, EXIT_REPLAN, -9, 1):
            mp.error(failed, code, 0, 100, "python")
        mp.warning("Sending process %s closing signal %s", 101, "SIGTERM")
        other.warning("a warning of another part of torch")
    finally:
        for log in (mp, other):
            log.removeHandler(handler)
    assert out.getvalue().splitlines() == ["failed (exitcode: -9) local_rank: 0 (pid: 100) of binary: python",
                                           "failed (exitcode: 1) local_rank: 0 (pid: 100) of binary: python",
                                           "a warning of another part of torch"]
