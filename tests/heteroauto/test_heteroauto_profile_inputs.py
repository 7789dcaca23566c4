"""What a plan is priced with: measured profiles, one file per chip type as `heteroauto profile --chip` writes
them, checked against the cluster, model, sequence length and micro-batch size they must fit; and the training
sequence length of a HuggingFace config (`--seq-len`, as `heteropp run --seq-len` trains) instead of its
max_position_embeddings."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.auto.cli import main
from heteropp.auto.planning import make_problem
from heteropp.auto.profiler import profile_model
from heteropp.auto.profiles import Profile
from heteropp.spec import SpecError, load_cluster, load_model, load_train

EX = Path(__file__).resolve().parents[2] / "examples"
CLUSTER, TRAIN = str(EX / "clusters" / "two-cpu.yaml"), str(EX / "training" / "tiny.yaml")


def _plan(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["plan", "--cluster", CLUSTER, "--train", TRAIN, "--no-progress", "--json", str(out), *args]) == 0
    plan = json.loads(out.read_text())
    plan.pop("search_time_s")
    return plan


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, Path]:
    """The tiny model measured on this machine as each of two-cpu.yaml's chip types, a file each."""
    d = tmp_path_factory.mktemp("profiles")
    out = {}
    for chip in ("big", "small"):
        out[chip] = d / f"{chip}.json"
        profile_model("tiny", [1, 2], chip=chip, repeats=1).save(out[chip])
    return out


def test_profiles_of_each_chip_type_price_the_plan_as_one_file_holding_both(tmp_path, measured):
    (tmp_path / "both.json").write_text(json.dumps(_both(measured)))
    one = _plan(tmp_path, "one", "--model", "tiny", "--profile", str(tmp_path / "both.json"))
    two = _plan(tmp_path, "two", "--model", "tiny", "--profile", str(measured["big"]), "--profile",
                str(measured["small"]))
    assert two == one


def _both(measured: dict[str, Path]) -> dict:
    both = json.loads(measured["big"].read_text())
    both["chips"].update(json.loads(measured["small"].read_text())["chips"])
    return both


@pytest.mark.parametrize("field,bad", [("seq_len", 64), ("layer_params", 1), ("micro_batch_size", 2),
                                       ("embed_params", 1), ("chips", "small"), ("chips", "small TP 2")])
def test_a_profile_that_does_not_fit_the_problem_exits_2_naming_the_field(tmp_path, capsys, measured, field, bad):
    """A profile without one of the cluster's chip types raised a KeyError traceback mid-search; one measured
    on another model, sequence length or micro-batch size planned silently with the wrong times."""
    data = _both(measured)
    if bad == "small TP 2":  # the type measured, but not at a TP size two-cpu.yaml's tp_max allows
        del data["chips"]["small"]["tp"]["2"]
    elif field == "chips":
        del data["chips"][bad]
    else:
        data[field] = bad
    (tmp_path / "bad.json").write_text(json.dumps(data))
    code = main(["plan", "--cluster", CLUSTER, "--train", TRAIN, "--model", "tiny", "--no-progress",
                 "--profile", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert code == 2 and f"field '{field}'" in err and "expected" in err and "Traceback" not in err, err


def test_a_measured_profile_handed_to_make_problem_is_checked_as_a_file_is(tmp_path, measured):
    """From Python too: a profile `heteroauto profile` measured, for another sequence length, is refused."""
    prof = Profile.from_dict(_both(measured))
    m = load_model("tiny", 16)
    with pytest.raises(SpecError, match=r"field 'seq_len': the profile was measured with seq_len 32, the problem "
                                        r"has 16"):
        make_problem(load_cluster(CLUSTER), m, load_train(TRAIN, m.seq_len), prof)


def test_one_chip_types_profile_twice_or_of_another_model_beside_the_other_exits_2(tmp_path, capsys, measured):
    args = ["plan", "--cluster", CLUSTER, "--train", TRAIN, "--model", "tiny", "--no-progress"]
    assert main([*args, "--profile", str(measured["big"]), "--profile", str(measured["big"])]) == 2
    assert "chip type 'big' is also in another profile" in capsys.readouterr().err
    other = json.loads(measured["small"].read_text())
    other["seq_len"] = 64
    (tmp_path / "small64.json").write_text(json.dumps(other))
    assert main([*args, "--profile", str(measured["big"]), "--profile", str(tmp_path / "small64.json")]) == 2
    assert "field 'seq_len': 64, while" in capsys.readouterr().err


def _hf_config(directory: Path, positions: int) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=positions)
    directory.mkdir(parents=True)
    config.save_pretrained(directory)  # transformers' own writer: config.json with architectures, model_type, ...
    return directory / "config.json"


def test_seq_len_plans_a_hf_config_as_its_max_position_embeddings_would(tmp_path, capsys):
    """A HF config's max_position_embeddings (131,072 for Llama 3.1 or Qwen2) is what the model can take, not
    what the run trains on: planned at it, an 8k-token run got a plan for 128k-token sequences."""
    long_config, short_config = _hf_config(tmp_path / "a" / "llama", 4096), _hf_config(tmp_path / "b" / "llama", 256)
    at_positions = _plan(tmp_path, "positions", "--model", str(long_config))
    flagged = _plan(tmp_path, "flagged", "--model", str(long_config), "--seq-len", "256")
    reference = _plan(tmp_path, "reference", "--model", str(short_config))
    assert flagged == reference and flagged != at_positions
    sim = tmp_path / "sim.json"
    assert main(["simulate", str(tmp_path / "flagged.json"), "--cluster", CLUSTER, "--train", TRAIN, "--model",
                 str(long_config), "--seq-len", "256", "--json", str(sim)]) == 0
    assert json.loads(sim.read_text())["iteration_time_s"] == pytest.approx(reference["iteration_time_s"], rel=1e-9)
    capsys.readouterr()
    assert main(["plan", "--cluster", CLUSTER, "--train", TRAIN, "--model", str(long_config), "--seq-len", "8192",
                 "--no-progress"]) == 2
    assert "8192 exceeds the model's max_position_embeddings=4096" in capsys.readouterr().err
