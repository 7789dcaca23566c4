"""Elastic training: how fast a run notices a lost host, re-plans and trains again, and how fast a host that comes
back is trained with.

Each repetition starts `heteropp run --elastic` for the tiny model over two emulated hosts (2 `big` + 2 `small`
processes, examples/clusters/two-cpu.yaml), SIGKILLs the `small` host (its torch elastic agent and its workers)
at a random step after the first checkpoint, and later starts that host again with the torchrun command the
launcher used (the `command` of its host_started event). From the run's own records (D/elastic.jsonl, the loss
log's per-step end times) and the kill time measured here:

- detection: first peer_failure (a survivor's worker saw the dead peer) - kill
- re-plan: plan_s of the round after the kill (HeteroAuto for the chips left, in rank 0)
- round start: that round's `started` (its workers began) - kill
- MTTR: end of the first step logged after the kill - kill
- work lost: the step at the kill - the step that round resumed from
- come back: end of the first step of the round that includes the returned host - its restart

Variants: `loopback` is the launcher as shipped (every agent on 127.0.0.1). `netns` (root only) runs the two
hosts in two network namespaces joined by a veth pair: the rendezvous store in a process of the first one, each
agent started with `ip netns exec` and its namespace's address (the same torchrun arguments the launcher
builds, `agent_command`); the namespaces are removed at the end.

    python -m bench.heteropp_elastic [--reps 3] [--variant loopback|netns|both] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from heteropp.engine.elastic_launch import AGENT_ENV, agent_command, host_command, kill_host, process_tree

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "examples" / "clusters" / "two-cpu.yaml"
PLAN = {"version": 2, "stages": [{"chip": "big", "tp": 2, "layers": 6}, {"chip": "small", "tp": 2, "layers": 2}],
        "dp": 1, "micro_batch_size": 1, "micro_batches": 8, "schedule": "1f1b"}
NS = ("hppel0", "hppel1")  # namespaces this bench creates and removes
VETH = ("hppelv0", "hppelv1")
ADDR = ("10.231.77.1", "10.231.77.2")


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for x in path.read_text().splitlines():
        try:
            out.append(json.loads(x))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


def _wait(cond: Any, what: str, proc: subprocess.Popen | None, timeout: float) -> Any:
    deadline = time.time() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) while waiting for {what}")
        if time.time() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def netns_up() -> None:
    netns_down()
    for ns in NS:
        _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    for ns, dev, addr in zip(NS, VETH, ADDR):
        _sh("ip", "link", "set", dev, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")


def netns_down() -> None:
    for ns in NS:  # deleting a namespace deletes its end of the veth pair, and so the pair
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def override_conf(cmd: list[str], conf: str) -> list[str]:
    """cmd with KEY=VALUE pairs of `conf` put into its --rdzv-conf (replacing the launcher's)."""
    if not conf:
        return cmd
    new = dict(kv.split("=", 1) for kv in conf.split(","))
    out = []
    for c in cmd:
        if c.startswith("--rdzv-conf="):
            old = dict(kv.split("=", 1) for kv in c.split("=", 1)[1].split(","))
            c = "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in {**old, **new}.items())
        out.append(c)
    return out


class Run:
    """One elastic run of two hosts; `hosts` maps chip -> (agent pid, command, env)."""

    def __init__(self, work: Path, variant: str, steps: int, every: int, conf: str = "", timeout_s: int = 30,
                 snapshot_every: int = 1) -> None:
        self.work, self.variant = work, variant
        self.ck, self.log = work / "ck", work / "loss.jsonl"
        plan = work / "plan.json"
        plan.write_text(json.dumps(PLAN))
        args = [sys.executable, "-m", "heteropp", "run", "--elastic", "--plan", str(plan), "--model", "tiny",
                "--cluster", str(CLUSTER), "--steps", str(steps), "--checkpoint-dir", str(self.ck),
                "--save-every", str(every), "--keep-checkpoints", "100", "--loss-log", str(self.log),
                "--backend", "gloo", "--timeout", str(timeout_s), "--max-restarts", "5",
                "--snapshot-every", str(snapshot_every)]
        self.out = open(work / "run.out", "w")
        self.procs: list[subprocess.Popen] = []
        # the job's secret, given so that the host started again here is one of the job (snapshot keepers)
        self.env = {**os.environ, "DICOMM_JOB_SECRET": secrets.token_hex(16)}
        if variant == "loopback":
            self.main = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT, env=self.env)
            self.procs.append(self.main)
            started = _wait(lambda: [e for e in _lines(self.ck / "elastic.jsonl") if e["event"] == "host_started"]
                            if len(_lines(self.ck / "elastic.jsonl")) >= 2 else None, "the hosts", self.main, 60)
            self.hosts = {e["chip"]: (e["pid"], e["command"], {**self.env, **AGENT_ENV}) for e in started}
            return
        # netns: the config as `--write-config` writes it, then the store and the agents by hand
        cfg = work / "run.json"
        subprocess.run(args + ["--write-config", str(cfg)], check=True, capture_output=True)
        # round 1's rank 0 writes its plan there before anything creates it (the launcher does on one machine)
        self.ck.mkdir(parents=True, exist_ok=True)
        port, run_id = 29411, f"bench-{uuid.uuid4().hex[:8]}"
        store = ("import datetime, time\nfrom torch.distributed import TCPStore\n"
                 f"s = TCPStore('{ADDR[0]}', {port}, is_master=True, wait_for_workers=False,"
                 " timeout=datetime.timedelta(seconds=600))\ntime.sleep(1e6)\n")
        self.main = subprocess.Popen(["ip", "netns", "exec", NS[0], sys.executable, "-c", store],
                                     stdout=self.out, stderr=subprocess.STDOUT)
        self.procs.append(self.main)
        time.sleep(3)
        self.hosts = {}
        for i, chip in enumerate(("big", "small")):
            cmd = agent_command(str(cfg), chip, 2, "1:2", f"{ADDR[0]}:{port}", run_id, 5, spawn=True)
            cmd = [c.replace("--local-addr=127.0.0.1", f"--local-addr={ADDR[i]}") for c in cmd]
            env = {**self.env, **AGENT_ENV, "GLOO_SOCKET_IFNAME": VETH[i]}
            cmd = ["ip", "netns", "exec", NS[i], *host_command(override_conf(cmd, conf), f"{ADDR[i]}:0")]
            p = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(p)
            self.hosts[chip] = (p.pid, cmd, env)  # `ip netns exec` execs the command: the pid is the agent's

    def restart(self, chip: str, conf: str = "") -> None:
        _, cmd, env = self.hosts[chip]
        cmd = override_conf(cmd, conf)
        p = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        self.hosts[chip] = (p.pid, cmd, env)

    def finished(self) -> bool:
        return any(e["event"] == "finished" for e in _lines(self.ck / "elastic.jsonl"))

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                if p is self.main and self.variant == "loopback":
                    p.terminate()  # the launcher takes its hosts down
                else:
                    kill_host(p.pid)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_host(p.pid)
                p.wait()
        self.out.close()


def complete(ck: Path) -> list[int]:
    """Steps of the complete checkpoints (step-NNNNNNNN/; step-NNNNNNNN.partial/ while written)."""
    return sorted(int(p.name[5:]) for p in ck.glob("step-*") if p.name[5:].isdigit())


def steps_of(log: Path) -> list[dict[str, Any]]:
    return _lines(log)


def workers(host_pid: int) -> set[int]:
    """The worker processes the agent under a host started (not the keeper, agent or warm process)."""
    out = set()
    for p in process_tree(host_pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        args = cmd.split(b"\0")
        # the agent's children: the worker module, or its stand-in that the host's warm process forks it for
        if (b"heteropp.engine.elastic" in args or any(a.endswith(b"elastic_spawn.py") for a in args)) \
                and b"torch.distributed.run" not in args:
            out.add(p)
    return out


class WorkerWatch(threading.Thread):
    """Watches a surviving host from the moment of the kill: when its workers of that moment are all gone (its
    agent stopped them) and when its next workers appear (the agent's new rendezvous round is complete)."""

    def __init__(self, host_pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.old = host_pid, workers(host_pid)
        self.stopped: float | None = None
        self.spawned: float | None = None
        self.done = False

    def run(self) -> None:
        while not self.done and (self.stopped is None or self.spawned is None):
            now, at = workers(self.pid), time.time()
            if self.stopped is None and not self.old & now:
                self.stopped = at
            if self.spawned is None and now - self.old:
                self.spawned = at
            time.sleep(0.01)


# the round's start as the survivors' new rank 0 recorded it (elastic.jsonl "resumed"), seconds after the kill
PHASES = ("imported", "control", "planned", "pg", "load_start", "load_end", "first_step_end")


def one(variant: str, steps: int, every: int, rng: random.Random, come_back: bool, conf: str,
        snapshot_every: int = 1) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="heteropp-elastic-"))
    load0, cpu0 = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN)
    t_start = time.time()
    run = Run(work, variant, steps, every, conf, snapshot_every=snapshot_every)
    row: dict[str, Any] = {"variant": variant, "rdzv_conf_override": conf, "snapshot_every": snapshot_every}
    try:
        ev = run.ck / "elastic.jsonl"
        first_round = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "round"), None), "round 1",
                            run.main, 300)
        if first_round["chips"] != {"big": 2, "small": 2}:
            # seen under load: one host's agent makes a round alone and the other a round of its own
            time.sleep(3)
            raise RuntimeError("round 1 did not hold both hosts: " + json.dumps(
                [e for e in _lines(ev) if e["event"] == "round"]))
        at = rng.randint(every + 1, 2 * every)  # after the first checkpoint, before the second
        # the first checkpoint is written in the background: wait until it is complete (renamed into place)
        _wait(lambda: len(steps_of(run.log)) >= at and complete(run.ck), f"step {at} and a checkpoint", run.main,
              300)
        killed_step = max(r["step"] for r in steps_of(run.log))
        newest = complete(run.ck)[-1]
        watch = WorkerWatch(run.hosts["big"][0])
        watch.start()
        kill_at = time.time()
        kill_host(run.hosts["small"][0])
        rnd = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "round" and e["started"] > kill_at), None),
                    "the round after the kill", run.main, 300)
        first = _wait(lambda: next((r for r in steps_of(run.log) if r["time"] > kill_at), None),
                      "a step after the kill", run.main, 300)
        fail = [e["time"] for e in _lines(ev) if e["event"] == "peer_failure" and e["time"] >= kill_at]
        resumed = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "resumed" and e["time"] > kill_at),
                                     None), "the new round's resumed event", run.main, 60)
        watch.done = True
        row.update({f"{k}_s": round(resumed[k] - kill_at, 3) for k in PHASES if k in resumed},
                   workers_stopped_s=round(watch.stopped - kill_at, 3) if watch.stopped else None,
                   workers_spawned_s=round(watch.spawned - kill_at, 3) if watch.spawned else None,
                   resume_source=resumed["source"])
        row = {**row, "killed_at_step": killed_step, "newest_checkpoint_at_kill": newest,
               "resume_from": rnd["resume_from"],
               "chips_after": rnd["chips"], "plan_after": rnd["plan"],
               "detection_s": round(min(fail) - kill_at, 3) if fail else None,
               "replan_s": rnd["plan_s"], "round_start_s": round(rnd["started"] - kill_at, 3),
               "plan_decided_s": round(rnd["time"] - kill_at, 3),
               # from the plan to the first step's start: process group, model, checkpoint load
               "setup_after_plan_s": round(first["time"] - first["step_s"] - rnd["time"], 3),
               "first_step_s": first["step_s"],
               "mttr_s": round(first["time"] - kill_at, 3), "work_lost_steps": killed_step - rnd["resume_from"],
               "startup_s": round(steps_of(run.log)[0]["time"] - t_start, 3),  # launch to step 1, for scale
               "first_round_start_s": round(first_round["started"] - t_start, 3)}
        if come_back:
            back_at = time.time()
            run.restart("small", conf)
            rnd2 = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "round" and e["started"] > back_at
                                       and e["chips"].get("small")), None), "a round with the host back",
                         run.main, 300)
            if rnd2["chips"] != {"big": 2, "small": 2}:
                # seen: the returned host declares the running one dead and makes a round of its own
                raise RuntimeError("the returned host did not join the running round (split): " + json.dumps(
                    [e for e in _lines(ev) if e["event"] == "round"]))
            step2 = _wait(lambda: next((r for r in steps_of(run.log) if r["time"] > rnd2["time"]), None),
                          "a step with the host back", run.main, 300)
            row.update(come_back_s=round(step2["time"] - back_at, 3),
                       come_back_round_start_s=round(rnd2["started"] - back_at, 3),
                       come_back_replan_s=rnd2["plan_s"], come_back_resume_from=rnd2["resume_from"])
        _wait(run.finished, "the run's end", None, 600)
    except RuntimeError as e:
        row["error"] = str(e)[:2000]
        print(f"{variant}: failed: {row['error']}", flush=True)
    finally:
        run.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row.update(load_before=round(load0, 2), load_after=round(os.getloadavg()[0], 2),
               cpu_s=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
               wall_s=round(time.time() - t_start, 1), steps=steps)
    if "error" in row:
        row["kept"] = str(work)  # for a look at run.out and elastic.jsonl
    else:
        shutil.rmtree(work, ignore_errors=True)
    return row


KEYS = ("detection_s", "workers_stopped_s", "workers_spawned_s", "imported_s", "control_s", "planned_s", "pg_s",
        "load_start_s", "load_end_s", "first_step_end_s", "replan_s", "first_step_s", "mttr_s", "work_lost_steps",
        "come_back_s", "startup_s")


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per variant (default 3)")
    ap.add_argument("--variant", choices=("loopback", "netns", "both"), default="loopback")
    ap.add_argument("--steps", type=int, default=40, help="steps per run (enough to kill, re-plan and come back)")
    ap.add_argument("--save-every", type=int, default=4, help="checkpoint interval in steps (default 4)")
    ap.add_argument("--no-come-back", action="store_true", help="skip restarting the killed host")
    ap.add_argument("--seed", type=int, default=0, help="for the kill steps")
    ap.add_argument("--rdzv-conf", default="",
                    help="KEY=VALUE,... put into the --rdzv-conf of the agents this bench starts itself (the "
                         "returned host; both hosts of netns), e.g. keep_alive_max_attempt=5")
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="in-memory snapshots every this many steps (0: off, every round resumes from disk)")
    ap.add_argument("--json", help="write every repetition and the medians here")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.steps < 4 * a.save_every:
        ap.error("--reps must be >= 1 and --steps >= 4 x --save-every (kill after the first checkpoint, then "
                 "re-plan and come back before the end)")
    variants = ["loopback", "netns"] if a.variant == "both" else [a.variant]
    rng = random.Random(a.seed)
    rows: list[dict[str, Any]] = []
    for v in variants:
        if v == "netns":
            if os.geteuid() != 0 or shutil.which("ip") is None:
                print("netns: skipped (needs root and `ip`)")
                continue
            netns_up()
        try:
            for i in range(a.reps):
                r = one(v, a.steps, a.save_every, rng, not a.no_come_back, a.rdzv_conf, a.snapshot_every)
                rows.append(r)
                print(f"{v} #{i + 1}: " + ", ".join(f"{k} {r.get(k)}" for k in KEYS + ("load_before", "cpu_s")),
                      flush=True)
        finally:
            if v == "netns":
                netns_down()
    print(f"\nmedians over {a.reps} repetitions (seconds; work lost in steps, checkpoint every {a.save_every}):")
    head = ("variant",) + KEYS + ("load", "cpu_s/run")
    print(" | ".join(head))
    summary = {}
    for v in variants:
        # a repetition that failed part way keeps what it measured before (the kill's numbers, say)
        sub = [r for r in rows if r["variant"] == v]
        failed = sum(1 for r in sub if "error" in r)
        if failed:
            print(f"{v}: {failed} of {len(sub)} repetitions failed part way (their rows say where and why)")
        med = {k: median_of(sub, k) for k in KEYS + ("load_before", "cpu_s")}
        med["reps"], med["failed"] = len(sub), failed
        summary[v] = med
        print(" | ".join([v] + [str(med[k]) for k in KEYS + ("load_before", "cpu_s")]))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "medians": summary, "save_every": a.save_every,
                                            "steps": a.steps, "cores": os.cpu_count()}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
