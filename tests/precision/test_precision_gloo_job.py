"""The gloo job examples' group context (ditorch_precision.examples.gloo_job.joined) leaves the group
also when its body raises, so the process can report and exit instead of holding it. Run in a fresh
interpreter: a process group is process state."""
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import datetime, os
    import torch.distributed as dist
    from ditorch_precision.examples.gloo_job import joined
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the rank joins the store served above
    try:
        with joined(0, 1, store.port):
            assert dist.is_initialized()
            raise ValueError("the body failed")
    except ValueError as e:
        print("raised:", e)
    print("initialised after:", dist.is_initialized())
""")


def test_a_body_that_raises_leaves_the_group_and_the_error_goes_on():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised: the body failed" in done.stdout
    assert "initialised after: False" in done.stdout, done.stdout
