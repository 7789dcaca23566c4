"""Look at and act on the emulated hosts of a `heteropp run --elastic` run, from its event file
(CHECKPOINT_DIR/elastic.jsonl) and its loss log.

    python hosts.py list EVENTS             the hosts started: number, chip type, processes, agent pid
    python hosts.py kill EVENTS CHIP        SIGKILL the newest host of that chip type: its agent and its workers
    python hosts.py command EVENTS CHIP     the shell line that starts that host again (its torchrun command)
    python hosts.py wait-step LOSS_LOG N    wait until step N is in the loss log
    python hosts.py wait-checkpoint DIR N   wait until the checkpoint of step N is complete in DIR
    python hosts.py wait-round EVENTS K     wait until round K has started training, then describe it
    python hosts.py rounds EVENTS LOSS_LOG  each round: chips, plan, step resumed from, steps trained
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path


def lines(path: str) -> list[dict]:
    p = Path(path)
    out = []
    for x in (p.read_text().splitlines() if p.exists() else []):
        try:
            out.append(json.loads(x))
        except json.JSONDecodeError:  # being written
            pass
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL pid and all its descendants, as heteropp.engine.elastic_launch.kill_host does (the agent's workers
    run in process groups of their own, so `kill -9 -PGID` would miss them). Kept free of torch so that it
    starts at once."""
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def host(events: str, chip: str) -> dict:
    started = [e for e in lines(events) if e["event"] == "host_started" and e["chip"] == chip]
    if not started:
        raise SystemExit(f"hosts.py: no host of chip type {chip!r} in {events}")
    return started[-1]


def wait(what: str, cond, timeout: float = 300) -> object:
    deadline = time.time() + timeout
    while not (got := cond()):
        if time.time() > deadline:
            raise SystemExit(f"hosts.py: no {what} after {timeout:.0f} s")
        time.sleep(0.2)
    return got


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd, path = argv[0], argv[1]
    if cmd == "list":
        for e in lines(path):
            if e["event"] == "host_started":
                print(f"host {e['host']} {e['chip']} x{e['processes']} pid {e['pid']}")
    elif cmd == "kill" and len(argv) == 3:
        e = host(path, argv[2])
        kill_tree(e["pid"])
        print(f"killed host {e['host']} ({e['chip']}, agent pid {e['pid']})")
    elif cmd == "command" and len(argv) == 3:
        from heteropp.engine.elastic_launch import AGENT_ENV
        e = host(path, argv[2])
        env = " ".join(f"{k}={v}" for k, v in AGENT_ENV.items())
        print(f"{env} exec {shlex.join(e['command'])}")
    elif cmd == "wait-step" and len(argv) == 3:
        n = int(argv[2])
        wait(f"step {n}", lambda: any(r["step"] >= n for r in lines(path)))
        print(f"step {n} done")
    elif cmd == "wait-checkpoint" and len(argv) == 3:
        # written in the background: step-N.partial/ until complete, then renamed to step-N/
        # older ones are removed (--keep-checkpoints): any complete one of step N or later will do
        n = int(argv[2])
        done = wait(f"checkpoint of step {n} or later", lambda: sorted(
            int(p.name[5:]) for p in Path(path).glob("step-*") if p.name[5:].isdigit() and int(p.name[5:]) >= n))
        print(f"checkpoint of step {done[-1]} complete")
    elif cmd == "wait-round" and len(argv) == 3:
        k = int(argv[2])
        # a round has started training once its plan is decided (rank 0 writes the round event then)
        r = wait(f"round {k}", lambda: next((e for e in lines(path) if e["event"] == "round" and e["round"] == k),
                                            None))
        memory = " (in memory)" if r.get("resume_source") == "memory" else ""  # a snapshot a keeper held
        print(f"round {k}: chips {r['chips']}, plan {' | '.join(r['plan'])}, re-planned in {r['plan_s']:.2f} s, "
              f"resumed from step {r['resume_from']}{memory}")
    elif cmd == "rounds" and len(argv) == 3:
        steps = lines(argv[2])
        rounds = [e for e in lines(path) if e["event"] == "round"]
        for i, r in enumerate(rounds):
            end = rounds[i + 1]["time"] if i + 1 < len(rounds) else float("inf")
            mine = [s["step"] for s in steps if r["time"] < s["time"] <= end]
            trained = f"steps {mine[0]}-{mine[-1]}" if mine else "no steps"
            print(f"round {r['round']}: chips {r['chips']}, resumed from step {r['resume_from']}, {trained}")
        failures = [e for e in lines(path) if e["event"] == "peer_failure"]
        print(f"{len(failures)} peer failures seen; loss at step {steps[-1]['step']}: {steps[-1]['loss']:.4f}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
