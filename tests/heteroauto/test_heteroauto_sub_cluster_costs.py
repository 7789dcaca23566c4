"""A baseline's sub-cluster is priced with the tables of the whole cluster's cost model (CostModel.on: they
depend on a chip's spec, not on how many there are), and only where the specs and links are the same: the
reference is a cost model built afresh on the sub-cluster (hand-set profiles stand in for measured chips)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from heteropp.auto.baselines import sub_cluster
from heteropp.auto.costs import CostModel

from heteroauto_helpers import chip, make_problem

LINKS = [{"between": ["X", "Y"], "bandwidth": 2, "latency": "1ms"}]


def _tables(cm: CostModel) -> list[object]:
    """What a search asks of the cost model, for every kind, dp and in-flight count of these tests."""
    names = [c.name for c in cm.cluster.chips]
    out: list[object] = []
    for a in names:
        for tp in (1, 2):
            for dp in (1, 2):
                for r in (False, True):
                    out.append(cm.coef(a, tp, r, dp))
                    out += [cm.max_layers(a, tp, r, dp, n, first, last) for n in (1, 3)
                            for first in (False, True) for last in (False, True)]
                out += [cm.end(a, tp, dp, w) for w in ("first", "last")]
                out += [cm.boundary(a, tp, b, 2, dp) for b in names] + [cm.latency(a, b) for b in names]
    return out


@pytest.fixture
def whole() -> CostModel:
    return make_problem([chip("X", 8, 14.0), chip("Y", 8, 7.0), chip("Z", 4, 20.0, net=5.0)],
                        {"X": 1.0, "Y": 0.5, "Z": 0.8}, layers=8, gb=8, links=LINKS)


@pytest.mark.parametrize("counts", [{"X": 4, "Y": 8}, {"Z": 2}, {"X": 8, "Y": 2, "Z": 4}])
def test_a_sub_cluster_prices_as_a_cost_model_of_its_own(whole, counts):
    sub = sub_cluster(whole.cluster, counts)
    got = whole.on(sub)
    assert got.coef is whole.coef  # shared, not recomputed
    assert _tables(got) == _tables(CostModel(sub, whole.model, whole.train, whole.profile))


@pytest.mark.parametrize("change", ["memory", "network", "link"])
def test_another_spec_or_link_is_not_priced_with_the_whole_clusters_tables(whole, change):
    cl = whole.cluster
    if change == "memory":
        cl = replace(cl, chips=tuple(replace(c, memory_gb=c.memory_gb / 2) if c.name == "X" else c for c in cl.chips))
    elif change == "network":
        cl = replace(cl, chips=tuple(replace(c, network_bw=1.0) if c.name == "Y" else c for c in cl.chips))
    else:
        cl = replace(cl, links={k: v / 4 for k, v in cl.links.items()})
    got = whole.on(cl)
    assert got.coef is not whole.coef
    fresh = CostModel(cl, whole.model, whole.train, whole.profile)
    assert _tables(got) == _tables(fresh)
    assert _tables(fresh) != _tables(whole)  # the change is one the tables see
