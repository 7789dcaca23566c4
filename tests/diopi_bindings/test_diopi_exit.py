"""The native device's autograd worker threads at interpreter exit (CPU tensors stand in for device memory).

A worker thread wakes the caller of ``backward()`` before it drops its own reference to the finished graph task,
so it can be the last owner. torch keeps Python objects in that task (a copy of the caller's contextvars
Context, at every backward); releasing them takes the GIL from inside a destructor. Once the interpreter is
finalizing, taking the GIL ends the thread with pthread_exit, and the process aborts with "terminate called
without an active exception". The device drains its worker threads from Python's atexit, before finalization.
"""
from __future__ import annotations

from diopi_testlib import run_python


def test_a_backward_on_the_device_releases_its_python_objects_before_the_interpreter_finalizes() -> None:
    # The window a loaded machine opens now and then, held open until the exit: every thread on one CPU, the
    # worker threads at SCHED_IDLE and the caller at SCHED_FIFO (where allowed). When a worker wakes the caller
    # at the end of a backward, the caller takes the CPU at once and keeps it until it blocks; the worker,
    # still owning the graph task, runs again only then. A switch interval of 1000 s keeps the GIL with the
    # caller too. Without SCHED_FIFO (not permitted), another process may still let the worker run earlier.
    got = run_python("""
    import atexit, contextvars, json, os, sys, torch
    released = []
    # Registered before the device's own exit step, so it runs after it (last in, first out).
    atexit.register(lambda: print(json.dumps({"released": released, "fifo": fifo})))
    from diopi_bindings import device
    device.enable(backend="native")
    x = torch.ones(4, device="diopi", requires_grad=True)
    (x * x).sum().backward()  # the worker threads are started and named by now
    cpu = min(os.sched_getaffinity(0))
    threads = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in threads:
        os.sched_setaffinity(tid, {cpu})
    workers = [t for t in threads if open(f"/proc/self/task/{t}/comm").read().startswith("pt_autograd")]
    assert workers, "no autograd worker thread"
    for tid in workers:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    # Runs before the device's exit step: the drain need not wait for an idle CPU.
    atexit.register(lambda: [os.sched_setscheduler(t, os.SCHED_OTHER, os.sched_param(0)) for t in workers])
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        fifo = True
    except PermissionError:
        fifo = False
    sys.setswitchinterval(1000)
    class Held:
        def __del__(self, note=released.append, finalizing=sys.is_finalizing):
            note(finalizing())
    var = contextvars.ContextVar("held")
    var.set(Held())
    (x * x).sum().backward()  # the graph task keeps a copy of this context
    var.set(None)  # now only that copy holds the Held
    """)
    assert got["released"] == [False], got
    assert "terminate called" not in got["_stderr"], got["_stderr"][-2000:]
