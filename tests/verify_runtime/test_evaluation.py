import pytest

from sparkgate.verify_runtime.evaluation import Blocks, acceptance

# ``evaluated`` (tests/conftest.py): one evaluation of a tiny target with an n-gram and a block drafter.
pytestmark = pytest.mark.usefixtures("one_thread")


def test_report_has_acceptance_by_depth_per_domain_and_drafter(evaluated):
    report, records, _ = evaluated
    assert set(report["domains"]) == {"code", "prose"} and set(records) == {"code", "prose"}
    for section in report["domains"].values():
        for name in ("ngram", "block"):
            acc = section[name]
            assert len(acc["survival"]) == len(acc["conditional_acceptance"]) == 7
            assert all(a >= b for a, b in zip(acc["survival"], acc["survival"][1:]))
            # E[a*] = Σ_k P(a* >= k)
            assert acc["mean_accepted"] == pytest.approx(sum(acc["survival"]), abs=1e-3)
            assert acc["steps"] > 0 and acc["draft_to_verify"] > 0
        assert {"before", "after"} <= set(section["calibration"])
    assert report["domains"]["code"]["ngram"]["mean_accepted"] > 0
    assert all(
        rec.gamma == 7 and all(r.mode == "static" for r in rec.requests) for recs in records.values() for rec in recs
    )
    assert set(report["draft_latency_ms"]) == {"ngram", "block"}
    assert {"code_mean_accepted", "sequential_gain_mean_accepted", "sts_mean_ece"} <= set(report["targets"])


def test_pooled_calibration_matches_the_rows(evaluated):
    report, records, sts = evaluated
    blocks = Blocks.from_records([r for recs in records.values() for r in recs])
    assert report["pooled"]["acceptance"] == acceptance(blocks)
    # Survival by hand: of every static block, the share whose full acceptance reaches depth k.
    full = [row.full_accept for recs in records.values() for rec in recs for row in rec.requests]
    by_hand = [sum(f >= k for f in full) / len(full) for k in range(1, 8)]
    assert report["pooled"]["acceptance"]["survival"] == pytest.approx(by_hand, abs=5e-5)  # reported to 4 places
    calib = report["pooled"]["calibration"]
    for name in ("before", "after"):
        assert all(u >= e - 1e-9 for u, e in zip(calib[name]["ece_upper"], calib[name]["ece"]))
        assert all(0 <= b <= 1 for b in calib[name]["brier"])
    assert report["sts_version"] == sts.version
