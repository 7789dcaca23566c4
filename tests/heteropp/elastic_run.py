"""Shared pieces of the elastic tests: a `heteropp run --elastic` over emulated hosts (one torch elastic agent per
host, processes over loopback, gloo) that a test kills and restarts hosts of, and the check of a resumed round
against resuming its checkpoint on its plan by hand."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from heteropp.engine import RunConfig, launch
from heteropp.engine.elastic_launch import AGENT_ENV, kill_host, release_host, throttle_host
from heteropp.plan import Plan
from heteropp.spec import PRESETS

REPO = Path(__file__).resolve().parents[2]
TWO_CPU = REPO / "examples/clusters/two-cpu.yaml"
# the plan given to `heteropp run`: every round re-plans, so only its global batch and schedule matter
PLAN = {"version": 2, "stages": [{"chip": "small", "tp": 2, "layers": 3}, {"chip": "big", "tp": 2, "layers": 5}],
        "dp": 1, "micro_batch_size": 1, "micro_batches": 8, "schedule": "1f1b"}


def lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for x in (path.read_text().splitlines() if path.exists() else []):
        try:
            out.append(json.loads(x))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


class ElasticRun:
    """One run; `hosts` as `--hosts` takes it (None: the cluster spec's hosts); in-memory snapshots every
    `snapshot_every` steps (0: none, every round resumes from the disk checkpoint)."""

    def __init__(self, tmp: Path, steps: int, every: int, hosts: str | None = None, timeout_s: int = 30,
                 max_restarts: int = 3, snapshot_every: int = 0, plan: dict[str, Any] | None = None,
                 model: str = "tiny", cluster: Path = TWO_CPU) -> None:
        """`plan`, `model`, `cluster`: what `heteropp run` is given (default PLAN, the tiny preset, two-cpu)."""
        self.tmp, self.steps, self.every = tmp, steps, every
        self.ck, self.log = tmp / "ck", tmp / "run.jsonl"
        plan_file = tmp / "plan.json"
        plan_file.write_text(json.dumps(plan or PLAN))
        cmd = [sys.executable, "-m", "heteropp", "run", "--elastic", "--plan", str(plan_file), "--model", model,
               "--cluster", str(cluster), "--steps", str(steps), "--checkpoint-dir", str(self.ck),
               "--save-every", str(every), "--keep-checkpoints", "100", "--loss-log", str(self.log),
               "--backend", "gloo", "--timeout", str(timeout_s), "--max-restarts", str(max_restarts),
               "--snapshot-every", str(snapshot_every)]
        if hosts:
            cmd += ["--hosts", hosts]
        # the job's secret, set here so that a host this test starts again is one of the job (its snapshot
        # keeper and its ranks show it; the launcher keeps a secret it is given)
        self.env = {**os.environ, "DICOMM_JOB_SECRET": secrets.token_hex(16)}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        self.extra: list[subprocess.Popen] = []  # hosts this test started again

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in lines(self.ck / "elastic.jsonl") if kind is None or e["event"] == kind]

    def rounds(self) -> list[dict[str, Any]]:
        return self.events("round")

    def steps_logged(self, after: float = 0.0) -> list[dict[str, Any]]:
        """The loss log's records of steps that ended after `after` (a resumed round rewrites the log)."""
        return [r for r in lines(self.log) if r["time"] > after]

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 240) -> Any:
        deadline = time.time() + timeout
        while not (got := cond()):
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise AssertionError(f"the run ended or stalled waiting for {what}:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        return got

    def wait_step(self, step: int, after: float = 0.0) -> float:
        """Waits until `step` is logged by a round that trained after `after`; returns the time it was."""
        rec = self.wait(lambda: next((r for r in self.steps_logged(after) if r["step"] >= step), None),
                        f"step {step}")
        return float(rec["time"])

    def wait_round(self, after: float) -> dict[str, Any]:
        """The first round whose workers started after `after`, once it has logged a step."""
        rnd = self.wait(lambda: next((r for r in self.rounds() if r["started"] > after), None), "a new round")
        self.wait(lambda: self.steps_logged(rnd["time"]), "the new round's first step")
        return rnd

    def host(self, chip: str) -> dict[str, Any]:
        """The newest host_started event of that chip type (its agent's pid and torchrun command)."""
        return [e for e in self.events("host_started") if e["chip"] == chip][-1]

    def kill(self, host: dict[str, Any]) -> float:
        at = time.time()
        kill_host(host["pid"])
        return at

    def restart(self, host: dict[str, Any], chip: str | None = None) -> float:
        """Starts that host again with its torchrun command, as another chip type if `chip` is given."""
        cmd = list(host["command"])
        if chip is not None:
            cmd[cmd.index("--chip") + 1] = chip
        at = time.time()
        self.extra.append(subprocess.Popen(cmd, env={**self.env, **AGENT_ENV}, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
        return at

    def output(self) -> str:
        if not hasattr(self, "_out"):
            self._out = self.proc.communicate()[0] if self.proc.poll() is not None else ""
        return self._out

    def finish(self, timeout: float = 300) -> dict[int, float]:
        """Waits for the run's end (exit 0); returns its losses by step, every step present once."""
        try:
            self._out = self.proc.communicate(timeout=timeout)[0]
        finally:
            self.close()
        assert self.proc.returncode == 0, self._out[-4000:]
        got = {r["step"]: r["loss"] for r in lines(self.log)}
        assert sorted(got) == list(range(1, self.steps + 1)), sorted(got)
        return got

    def stop(self) -> dict[int, float]:
        """Stops the run (the launcher takes its hosts down); returns its losses by step, the latest line of each."""
        self.close()
        return {r["step"]: r["loss"] for r in lines(self.log)}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the launcher takes its hosts down
            self.proc.wait(timeout=30)
        for p in self.extra:
            if p.poll() is None:
                kill_host(p.pid)
                p.wait(timeout=30)

    def complete(self) -> list[int]:
        return sorted(int(p.name[5:]) for p in self.ck.glob("step-*") if p.name[5:].isdigit())

    def check_by_hand(self, rnd: dict[str, Any], got: dict[int, float], upto: int | None = None) -> None:
        """The steps round `rnd` trained (resume_from + 1 .. upto) equal, value for value, a run resumed by hand
        from the checkpoint it resumed from, on the plan it used."""
        start, upto = rnd["resume_from"], upto or self.steps
        if upto <= start:  # the next round resumed from the same checkpoint: none of this round's steps stayed
            return
        hand = self.tmp / f"hand-{rnd['round']}"
        hand.mkdir()
        if start:  # else the round started afresh
            # the run's checkpoint of that step; a round resumed from a memory snapshot of a step whose disk
            # checkpoint never completed (a restart came first) starts from the by-hand run of the round before,
            # which ended at that step and saved it
            src = self.ck / f"step-{start:08d}"
            if not (src / "trainer.json").exists():
                src = next(self.tmp.glob(f"hand-*/step-{start:08d}"))
            shutil.copytree(src, hand / f"step-{start:08d}")
        plan = Plan.load(self.ck / f"plan-round{rnd['round']}.json")
        log = hand / "loss.jsonl"
        # up to `upto` only: the learning rate is constant, so the run's length changes no step before it
        cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(PRESETS["tiny"]), steps=upto,
                        backend="gloo", chip_map={"big": "cpu", "small": "cpu"}, loss_log=str(log),
                        options={"checkpoint_dir": str(hand), "resume": bool(start)})
        launch(cfg)
        by_hand = {r["step"]: r["loss"] for r in lines(log) if start < r["step"] <= upto}
        assert sorted(by_hand) == list(range(start + 1, upto + 1))
        assert {s: got[s] for s in by_hand} == by_hand, (rnd, {s: (got[s], by_hand[s]) for s in by_hand})


def throttled_until_replan(run: ElasticRun, chip: str, share: float = 0.1) -> tuple[dict[str, Any], dict[int, float]]:
    """After step 3, throttles the `chip` host (its agent and workers, and those it starts later) to `share` of a
    core with a cpu cgroup (v1, root) until the run ends; returns the first verdict to re-plan (a `straggler`
    event) and the run's losses by step, once the round after that verdict has trained and the run has ended."""
    group = None
    try:
        run.wait_step(3)
        group = throttle_host(run.host(chip)["pid"], f"heteropp-test-{os.getpid()}", share)
        verdict = run.wait(lambda: next((e for e in run.events("straggler") if e["replan"]), None),
                           "a verdict to re-plan", timeout=300)
        run.wait_round(verdict["time"])
        got = run.finish()
        # the console says it too: the chip, how much slower, and what the re-plan was judged worth
        said = f"heteropp elastic: step {verdict['step']}: chip {chip} ("
        line = next((x for x in run.output().splitlines() if x.startswith(said)), None)
        assert line is not None and line.endswith("this round ends, the next runs it"), run.output()
        assert f"gain {verdict['gain_s']:g} s over {verdict['steps_left']} steps, cost {verdict['cost_s']:g} s" in line
        return verdict, got
    finally:
        run.close()
        if group is not None:
            release_host(group)
