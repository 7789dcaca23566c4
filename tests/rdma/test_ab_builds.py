"""The build comparison tool (ab_builds.py) renames the module in a copy of the tree: the patterns it
rewrites must exist in the tree as it is, and the summary must pair blocks by build, not by order."""
import json

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
