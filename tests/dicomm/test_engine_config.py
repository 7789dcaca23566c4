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
            if var not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "k.name"):
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
