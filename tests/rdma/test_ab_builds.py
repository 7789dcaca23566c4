"""The build comparison tool (ab_builds.py) renames the module in a copy of the tree: the patterns it
rewrites must exist in the tree as it is, the summary must pair blocks by build, not by order, and
the per-rank script (ab_pingpong.py) must run against the modules as they are."""
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

from tests.rdma import ab_builds, lab


def test_every_pattern_the_renamed_build_rewrites_is_in_the_tree():
    for rel, pairs in ab_builds.RENAMES.items():
        text = (lab.REPO / rel).read_text()
        for old, _ in pairs:
            assert old in text, (rel, old)


def test_the_summary_pairs_blocks_by_build_whichever_was_made_first():
    runs = {
        "run0.json": json.dumps({"builds": ["_ab_a.so", "_ab_b.so"],
                                 "medians_us": [[16.0, 17.0, 16.5], [15.0, 16.5, 16.7]]}),
        "run1.json": json.dumps({"builds": ["_ab_b.so", "_ab_a.so"],
                                 "medians_us": [[14.0, 14.2, 14.1], [15.0, 15.0, 15.0]]}),
    }
    lines, diffs = ab_builds.summarize(runs, ("_ab_a.so", "_ab_b.so"))
    # run 0: B - A per block -1.0, -0.5, +0.2 -> median -0.5; run 1: -1.0, -0.8, -0.9 -> -0.9
    assert [round(d, 6) for d in diffs] == [-0.5, -0.9]
    assert "B faster in 2 of 3" in lines[0] and "B faster in 3 of 3" in lines[1] and "_ab_b.so made first" in lines[1]


def test_the_per_rank_script_runs_an_a_a_comparison_of_the_installed_build(tmp_path):
    """ab_pingpong.py itself, briefly, on the host: two ranks, each loading the installed engine and
    benchmark modules as both builds, over tcp on loopback. Rank 0 writes a median per block and
    build (the script once called the loops on the engine module after they had moved out of it)."""
    script = Path(ab_builds.__file__).with_name("ab_pingpong.py")
    out = tmp_path / "ab.json"
    # The store is served from here, on a port held throughout (a free port picked here and bound by
    # rank 0 after its imports could be taken in between by another socket of this host).
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    args = [str(server.port), "2", "20", "installed", "installed", str(out), "tcp"]
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", AB_STORE_SERVED="1")
    peer = subprocess.Popen([sys.executable, str(script), "1", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        first = subprocess.run([sys.executable, str(script), "0", *args], env=env, capture_output=True, text=True,
                               timeout=120)
        peer_out, _ = peer.communicate(timeout=60)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    assert first.returncode == 0 and peer.returncode == 0, (first.stderr[-2000:], peer_out[-2000:])
    res = json.loads(out.read_text())
    assert res["builds"] == ["installed", "installed"]
    assert [len(m) for m in res["medians_us"]] == [2, 2] and all(x > 0 for m in res["medians_us"] for x in m), res


def test_a_build_argument_without_its_benchmark_module_is_refused(tmp_path):
    script = Path(ab_builds.__file__).with_name("ab_pingpong.py")
    p = subprocess.run([sys.executable, str(script), "0", "1", "1", "1", "core.so", "installed", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "expected CORE.so,BENCH.so or 'installed'" in p.stderr, p.stderr
