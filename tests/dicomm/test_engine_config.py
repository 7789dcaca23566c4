"""One configuration: every DICOMM_* setting the C++ code reads is in one table (core/config.cpp), the
reference page docs/dicomm-config.md lists the same knobs with the same defaults and forms (parsed here,
so the two cannot drift), and a bad value fails a communicator's creation with an error naming the
variable and the form the page documents."""
import datetime
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "dicomm-config.md"
CSRC = REPO / "dicomm" / "csrc"


def _documented() -> dict[str, dict[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(DICOMM_[A-Z0-9_]+)` \| (.*?) \| (.*?) \| (.*?) \| (.*) \|$", line)
        if m:
            name, default, form, unit, _ = m.groups()
            rows[name] = {"default": "" if default == "(unset)" else default.strip("`"), "form": form,
                          "unit": "" if unit == "-" else unit}
    return rows


def test_the_docs_table_and_the_code_table_agree():
    import dicomm._C as C

    code = {k["name"]: {"default": k["default"], "form": k["form"], "unit": k["unit"]} for k in C._config_knobs()}
    assert _documented() == code


def test_every_variable_the_cpp_code_names_is_in_the_table():
    """A knob read anywhere in dicomm/csrc goes through the table: no string "DICOMM_..." outside it,
    and no getenv but the table's own (and the launcher's hints)."""
    table = set(_documented())
    named, getenv = set(), []
    for f in CSRC.rglob("*.[ch]*"):
        code = re.sub(r"//.*", "", f.read_text())
        named |= set(re.findall(r'"(DICOMM_[A-Z0-9_]+)', code))
        for var in re.findall(r'getenv\("([A-Z_]+)"\)', code) + re.findall(r"getenv\((k\.name)\)", code):
            if var not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_USE_AGENT_STORE", "k.name"):
                getenv.append(f"{f.relative_to(CSRC)}: {var}")
    assert named - table == set()
    assert getenv == []


BAD = {  # variable -> a value of the wrong form
    "DICOMM_TCP_STREAMS": "100",
    "DICOMM_SPIN_US": "-5",
    "DICOMM_CONNECT": "sometimes",
    "DICOMM_SHM_CMA": "yes",
    "DICOMM_IB_SLOTS": "2",
    "DICOMM_COLL_CHUNK_BYTES": "0",
    "DICOMM_LOG_LEVEL": "loud",
    "DICOMM_HANDSHAKE_TIMEOUT_MS": "5s",
    "DICOMM_UNEXPECTED_MB": "lots",
    "DICOMM_SPIN_YIELD_EVERY": "8.5",
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_value_names_the_variable_and_the_documented_form(name, monkeypatch):
    import torch.distributed as dist

    import dicomm._C as C

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.setenv(name, BAD[name])
    with pytest.raises(C.ValueError) as err:
        C.Communicator(store, 0, 1, 5.0, "auto").close()
    assert str(err.value) == f"{name}='{BAD[name]}' is not valid; expected {_documented()[name]['form']}"


def test_good_values_are_accepted(monkeypatch):
    """The checks refuse only what the table refuses: values at the edges of each range work."""
    import torch.distributed as dist

    import dicomm._C as C

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    for name, value in {"DICOMM_TCP_STREAMS": "64", "DICOMM_SPIN_US": "0", "DICOMM_CONNECT": "LAZY",
                        "DICOMM_SHM_CMA": "0", "DICOMM_IB_SLOTS": "4", "DICOMM_LOG_LEVEL": "Error"}.items():
        monkeypatch.setenv(name, value)
    c = C.Communicator(store, 0, 1, 5.0, "auto")
    assert c.size == 1
    c.close()


def _two_communicators_two_chunk_sizes(rank, world_size, store):
    """Two communicators alive at once in this process, created with different collective chunk
    sizes, each broadcasting 1 MiB (the pipelined chain): rank 0's messages per broadcast, and
    whether every rank got root's bytes."""
    import numpy as np
    import torch.distributed as dist

    import dicomm._C as C

    chunks = {"64k": {"DICOMM_COLL_CHUNK_BYTES": "65536"}, "default": {}}
    comms = {name: C.Communicator(dist.PrefixStore(name, store), rank, world_size, 60.0, "auto", settings)
             for name, settings in chunks.items()}
    sent, intact = {}, {}
    for name, c in comms.items():
        want = np.random.default_rng(len(name)).integers(0, 256, 1 << 20, dtype=np.uint8)
        buf = want.copy() if rank == 0 else np.zeros_like(want)
        before = c.stats()["messages_sent"]
        c.broadcast(buf.ctypes.data, buf.nbytes, 0).wait()
        sent[name] = c.stats()["messages_sent"] - before
        intact[name] = bool((buf == want).all())
    for name, c in comms.items():
        store.set(f"{name}-done{rank}", "1")
        store.wait([f"{name}-done{r}" for r in range(world_size)])
        c.close()
    return sent, intact


def test_two_communicators_of_one_process_keep_their_own_settings():
    """Settings passed to one communicator reach its collectives, not the process: 1 MiB broadcast in
    64 KiB chunks takes 16 chunk messages from the root, in the default 512 KiB chunks 2, with both
    communicators alive in the same processes at once."""
    from tests.dicomm.multiproc import run_ranks

    results = run_ranks(_two_communicators_two_chunk_sizes, 2, timeout=120)
    for _, intact in results:
        assert intact == {"64k": True, "default": True}, results
    # Besides the chunks, each rank sends the same fixed number of messages per collective.
    root, other = results[0][0], results[1][0]
    assert other["64k"] == other["default"], results
    assert root["64k"] - root["default"] == (1 << 20) // 65536 - (1 << 20) // (512 << 10), results


@pytest.mark.parametrize("settings, message", [
    ({"DICOMM_NO_SUCH_KNOB": "1"}, "unknown setting 'DICOMM_NO_SUCH_KNOB'"),
    ({"DICOMM_COLL_CHUNK_BYTES": "0"}, "DICOMM_COLL_CHUNK_BYTES='0' is not valid; expected an integer >= 1"),
    ({"DICOMM_LOG_LEVEL": "debug"}, "DICOMM_LOG_LEVEL cannot be set per communicator"),
])
def test_a_bad_setting_names_itself(settings, message):
    import torch.distributed as dist

    import dicomm._C as C

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    with pytest.raises(C.ValueError, match=message):
        C.Communicator(store, 0, 1, 5.0, "auto", settings).close()


def test_the_environment_overrides_a_setting(monkeypatch):
    """As documented: options first, then the environment, which wins (stats() reports the yield
    period the communicator's waiters use)."""
    import torch.distributed as dist

    import dicomm._C as C

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.delenv("DICOMM_SPIN_YIELD_EVERY", raising=False)
    seen = []
    for prefix, env in (("a", None), ("b", "7")):
        if env:
            monkeypatch.setenv("DICOMM_SPIN_YIELD_EVERY", env)
        c = C.Communicator(dist.PrefixStore(prefix, store), 0, 1, 5.0, "auto", {"DICOMM_SPIN_YIELD_EVERY": "5"})
        seen.append(c.stats()["spin_yield_every"])
        c.close()
    assert seen == [5, 7]
