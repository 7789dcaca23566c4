"""The hosts `heteropp run --elastic` starts join their first rendezvous round together: an agent that reaches
it late (importing torch on a busy machine) no longer leaves the others to form a round without it, one second
later (torch's last call), which restarted every worker at the next round. Real processes and a real TCPStore
(the launcher's); the reference is the wall clock: each agent leaves the wait only once the last has arrived."""
import datetime
import os
import subprocess
import sys
import time

from torch.distributed import TCPStore

from heteropp.engine.first_round import FIRST_ROUND_ENV

AGENT = """
import sys, time
time.sleep(float(sys.argv[1]))  # this host's torch import, slower on a busy machine
from heteropp.engine.first_round import wait_for_the_others
wait_for_the_others()
print(time.time())
"""


def _agents(delays: list[float], env: dict) -> list[float]:
    procs = [subprocess.Popen([sys.executable, "-c", AGENT, str(d)], env=env, stdout=subprocess.PIPE,
                              text=True) for d in delays]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [float(o.split()[-1]) for o in outs]


def test_the_first_hosts_leave_the_wait_together_and_a_restarted_one_does_not_wait() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    env = {k: v for k, v in os.environ.items() if k != FIRST_ROUND_ENV}
    start = time.time()
    left = _agents([0.0, 0.0, 3.0], {**env, FIRST_ROUND_ENV: f"3 run-a 127.0.0.1:{store.port}"})
    assert min(left) - start >= 3.0, [t - start for t in left]  # none before the late one arrived
    assert max(left) - min(left) < 1.0, [t - start for t in left]  # within torch's last call of each other
    # a host started again later has no FIRST_ROUND_ENV: it joins at once, counting for no one
    start = time.time()
    (alone,) = _agents([0.0], env)
    assert alone - start < 20.0
    assert store.add("heteropp/first_round/run-a", 0) == 3
