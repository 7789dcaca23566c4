"""`heteropp run --elastic` on one machine: one torch elastic agent (`torchrun`) per emulated host, all joining
one c10d rendezvous whose store this process holds, so any host can die and come back (the store does not
die with it). Across machines, run the same torchrun command on every host instead (docs/heteropp.md,
"Elastic training")."""
from __future__ import annotations

import datetime
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from heteropp.engine.first_round import FIRST_ROUND_ENV

# Rendezvous settings for a quick re-plan: a host that stops its heartbeat for 3 s is gone (the survivors wait
# that long for the next round; at 2 s a busy host's own agent missed beats, was taken for dead and its round
# split off, at 3 s no split was seen at load 10-15), and a round starts 1 s after its last member joined (the
# least: torch takes whole seconds, and a returned host must have time to join the same round).
RDZV_CONF = "last_call_timeout=1,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3,close_timeout=5"


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc; the agent's workers run in process groups of their own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def kill_host(pid: int) -> None:
    """SIGKILL an emulated host: its agent and every process under it."""
    for p in process_tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller


def throttle_host(pid: int, name: str, share: float) -> Path:
    """Slow an emulated host down as a throttled machine: its agent and every process under it move into a new
    cpu cgroup (v1; root) limited to `share` of one core; workers its agent starts later are born inside it.
    Returns the cgroup, for release_host."""
    group = CPU_CGROUP / name
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
    for p in process_tree(pid):
        try:
            (group / "cgroup.procs").write_text(str(p))
        except ProcessLookupError:
            pass
    return group


def release_host(group: Path) -> None:
    """Move the processes of a throttle_host cgroup back to the root cgroup and remove it."""
    for p in (group / "cgroup.procs").read_text().split():
        try:
            (CPU_CGROUP / "cgroup.procs").write_text(p)
        except OSError:  # gone meanwhile
            pass
    group.rmdir()


# Every rendezvous round gets a fresh store for its workers: with the store shared across rounds (torch's
# default), keys of the previous round's process groups are still there and a new round's gloo group
# connects to ranks that are gone ("connectFullMesh failed ... Connection refused").
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SPAWN = Path(__file__).with_name("elastic_spawn.py")


def agent_command(config: str, chip: str, nproc: int, nnodes: str, endpoint: str, run_id: str, max_restarts: int,
                  is_host: bool = False, spawn: bool = False, quiet: bool = False) -> list[str]:
    """The torchrun command of one host; with `spawn` its workers are forked by the host's warm process (the
    keeper's zygote: elastic_spawn.py, by its path in this installation) instead of each importing torch;
    `quiet`: torchrun without torch elastic's own logs (quiet_agent.py)."""
    entry = [str(SPAWN)] if spawn else ["-m", "heteropp.engine.elastic"]
    agent = "heteropp.engine.quiet_agent" if quiet else "torch.distributed.run"
    return [sys.executable, "-m", agent, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}", f"--rdzv-conf=is_host={str(is_host).lower()},{RDZV_CONF}",
            "--monitor-interval=0.2", "--local-addr=127.0.0.1", *entry, "--config", config, "--chip", chip]


KEEPER = Path(__file__).with_name("snapshot_keeper.py")


def host_command(agent: list[str], listen: str) -> list[str]:
    """An emulated host: its snapshot keeper (listening at `listen`), which runs the host's agent as its child,
    so killing the keeper's process tree takes the whole host down. A script, not `-m`: no torch to import."""
    return [sys.executable, str(KEEPER), "--listen", listen, "--", *agent]


def launch_hosts(config: str, hosts: list[tuple[str, int]], max_restarts: int, events: Path | None,
                 min_nodes: int = 1, agent_logs: bool = False) -> int:
    """Start the hosts (each a snapshot keeper and its agent) and wait for them; returns the first non-zero exit
    code, or 0. `agent_logs`: keep torch elastic's own logs (a lost worker's exit code, restarts), which the
    workers' one line each and the round lines already say (`heteropp run --verbose`)."""
    from torch.distributed import TCPStore
    port = _free_port()
    # the rendezvous store lives here, apart from every emulated host
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=600))
    run_id = f"heteropp-{uuid.uuid4().hex[:8]}"
    # one fresh dicomm secret for the whole job, every host's workers alike (unless the user set one)
    env = {**os.environ, **AGENT_ENV, "DICOMM_JOB_SECRET": os.environ.get("DICOMM_JOB_SECRET") or secrets.token_hex(16)}
    procs = []
    # the quiet agents join their first round together (first_round.py); torchrun's own (agent_logs) as it comes
    first = {FIRST_ROUND_ENV: f"{len(hosts)} {run_id} 127.0.0.1:{port}"} if not agent_logs else {}
    for i, (chip, n) in enumerate(hosts):
        cmd = host_command(agent_command(config, chip, n, f"{min_nodes}:{len(hosts)}", f"127.0.0.1:{port}",
                                         run_id, max_restarts, spawn=True, quiet=not agent_logs), "127.0.0.1:0")
        p = subprocess.Popen(cmd, env={**env, **first}, start_new_session=True)
        procs.append(p)
        if events is not None:
            events.parent.mkdir(parents=True, exist_ok=True)
            with open(events, "a") as f:
                f.write(json.dumps({"event": "host_started", "time": round(time.time(), 3), "host": i, "chip": chip,
                                    "processes": n, "pid": p.pid, "command": cmd}) + "\n")
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        codes = [p.wait() for p in procs]
    finally:  # interrupted or terminated: take the hosts down with this process
        signal.signal(signal.SIGTERM, previous)
        for p in procs:
            if p.poll() is None:
                kill_host(p.pid)
        del store
    bad = [c for c in codes if c not in (0, -signal.SIGKILL)]
    return bad[0] if bad else (0 if any(c == 0 for c in codes) else codes[0])
