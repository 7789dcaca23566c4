"""One TP rule for the planner, plan validation and the engine: a TP size must divide heads, ffn and vocab,
and divide kv_heads or be a multiple of it. The planner must never propose a size the engine refuses."""
from __future__ import annotations

import itertools

import pytest

from heteropp.auto.planning import run_search, to_plan
from heteropp.auto.space import stage_tp_choices, tp_counts, tp_sizes
from heteropp.auto.uniform import uniform_1f1b
from heteropp.engine.checks import check_run
from heteropp.model import StageModel, TPGroup
from heteropp.model.stage import check_tp
from heteropp.plan import Plan, StagePlan, tp_split_error
from heteropp.spec import PRESETS, ModelSpec, SpecError

from heteroauto_helpers import chip_type, tp4_problem

TINY = PRESETS["tiny"]  # heads 4, kv_heads 2, ffn 172, vocab 256: every TP up to 4 is valid
ODD_FFN = ModelSpec("odd-ffn", layers=8, hidden=64, heads=4, kv_heads=2, ffn=174, vocab=256, seq_len=32)
ODD_VOCAB = ModelSpec("odd-vocab", layers=8, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=258, seq_len=32)


def _model(heads: int, kv_heads: int, ffn: int, vocab: int) -> ModelSpec:
    return ModelSpec("grid", layers=2, hidden=8 * heads, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab,
                     seq_len=8)


def _engine_rule(tp: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> bool:
    """Written from the engine's statement of the rule, independently of the shared code."""
    return (heads % tp == 0 and ffn % tp == 0 and vocab % tp == 0
            and (kv_heads % tp == 0 or tp % kv_heads == 0))


COUNTS = [(4, 2, 172, 256), (4, 2, 174, 256), (4, 2, 172, 258), (64, 8, 36864, 92544), (64, 8, 36868, 92544),
          (16, 16, 8192, 50304), (32, 4, 11008, 32000), (8, 1, 344, 1000), (12, 3, 48, 96), (8, 8, 4096, 1000)]


@pytest.mark.parametrize("tp_max", [4, 8, 16, 64])
@pytest.mark.parametrize("heads,kv_heads,ffn,vocab", COUNTS)
def test_tp_candidates_match_brute_force(heads, kv_heads, ffn, vocab, tp_max):
    brute = [t for t in range(1, tp_max + 1) if t & (t - 1) == 0 and _engine_rule(t, heads, kv_heads, ffn, vocab)]
    assert tp_sizes(chip_type(tp_max), heads, kv_heads, ffn, vocab) == brute
    assert tp_sizes(chip_type(tp_max), *tp_counts(_model(heads, kv_heads, ffn, vocab))) == brute


def test_engine_check_agrees_with_rule_on_grid():
    for tp, heads, kv_heads, ffn, vocab in itertools.product((1, 2, 3, 4, 8, 16), (4, 6, 8, 12, 64), (1, 2, 3, 8),
                                                            (172, 174, 96, 4096), (256, 258, 1000, 50304)):
        if heads % kv_heads:
            continue
        ok = _engine_rule(tp, heads, kv_heads, ffn, vocab)
        why = check_tp(_model(heads, kv_heads, ffn, vocab), tp)
        case = (tp, heads, kv_heads, ffn, vocab)
        assert (why is None) == ok == (tp_split_error(*case) is None), case
        if why is not None:
            assert f"tp={tp}" in why and "expected a tp that is" in why


def test_stage_choices_skip_tp_not_dividing_ffn():
    got = {t for tps in stage_tp_choices(chip_type(4), 16, 64, *tp_counts(ODD_FFN)) for t in tps}
    assert got == {1, 2}
    assert tp_sizes(chip_type(8), *tp_counts(TINY)) == [1, 2, 4]


@pytest.mark.parametrize("m", [ODD_FFN, ODD_VOCAB], ids=lambda m: m.name)
@pytest.mark.parametrize("algo", ["auto", "h2"])
def test_planner_proposes_no_tp_the_engine_rejects(algo, m):
    pb = tp4_problem(m)
    res = run_search(pb, algo, group_size=4)
    plan = to_plan(pb, res.best, res.search_time_s, algo)
    assert all(s.tp in (1, 2) for s in plan.stages), [s.tp for s in plan.stages]
    # the plan may leave chips idle (one TP-2 stage on 2 of the 4 chips: the slow network makes a second stage
    # 100x slower), never use more than there are
    plan.validate("<plan>", num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab,
                  available={"A": 4})
    for s in plan.stages:
        assert check_tp(m, s.tp) is None


def test_uniform_baseline_skips_tp_not_dividing_ffn():
    best = uniform_1f1b(tp4_problem(ODD_FFN).cm)
    assert best is not None and {s.tp for s in best.stages} <= {1, 2}


def _tp4_plan() -> Plan:
    return Plan(stages=[StagePlan("A", 4, 8)], dp=1, micro_batch_size=1, micro_batches=1)


@pytest.mark.parametrize("m,field", [(ODD_FFN, "ffn=174"), (ODD_VOCAB, "vocab=258")], ids=["ffn", "vocab"])
def test_plan_validate_names_ffn_and_vocab(m, field):
    with pytest.raises(SpecError) as e:
        _tp4_plan().validate("<plan>", heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab)
    n = int(field.split("=")[1])
    assert e.value.field == "stages[0].tp"
    assert e.value.problem == f"tp=4 does not divide the model's {field}"
    assert e.value.expected == f"a divisor of {n}"
    _tp4_plan().validate("<plan>", heads=m.heads, kv_heads=m.kv_heads)  # counts not given: not checked


def test_plan_validate_head_errors_unchanged():
    with pytest.raises(SpecError, match=r"tp=4 does not divide the model's heads=6 \(expected a divisor of 6\)"):
        _tp4_plan().validate(heads=6)
    with pytest.raises(SpecError, match=r"tp=4 neither divides nor is a multiple of the model's kv_heads=3 "
                                        r"\(expected a divisor or a multiple of 3\)"):
        _tp4_plan().validate(heads=12, kv_heads=3)


@pytest.mark.parametrize("m,field", [(ODD_FFN, "ffn=174"), (ODD_VOCAB, "vocab=258")], ids=["ffn", "vocab"])
def test_engine_rejects_what_the_rule_rejects(m, field):
    with pytest.raises(ValueError, match=rf"does not divide the model's {field}; expected a tp that is a divisor"):
        StageModel(m, range(1), TPGroup(0, 4), seed=0, first=True, last=True)
    with pytest.raises(SpecError, match=rf"stages\[0\]\.tp.*{field}"):
        check_run(_tp4_plan(), m, "<plan>", {}, [])
    StageModel(m, range(1), TPGroup(0, 2), seed=0, first=True, last=True)
