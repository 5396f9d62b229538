"""The figures behind the pages: the ledger's latest change and verdicts, rules, window lengths, depth rows."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgate.collectors.schema import MODES
from sparkgate.dashboards import data


def decision(action: str, *reasons: dict, **fields) -> dict:
    return {"action": action, "reasons": list(reasons), **fields}


def test_the_latest_change_and_the_latest_judged_gates():
    ledger = [
        decision("start", {"rule": "start"}, revision=1),
        decision("hold", {"rule": "passing"}, {"gate": "survival_ece", "outcome": "pass"}, revision=1),
        decision("advance", {"rule": "consecutive passes"}, {"gate": "survival_ece", "outcome": "pass"}, revision=2),
        decision("pause", {"rule": "operator pause", "note": ""}, revision=3),
    ]
    assert data.latest_change(ledger)["action"] == "pause"
    assert data.latest_change(ledger[1:2]) is None
    judged, gates = data.latest_verdicts(ledger)
    assert judged["action"] == "advance" and gates == [{"gate": "survival_ece", "outcome": "pass"}]
    assert data.latest_verdicts(ledger[:1]) == (None, [])


def test_a_rule_is_shown_with_its_details_and_without_empty_ones():
    assert data.rule_of(decision("pause", {"rule": "operator pause", "note": ""})) == "operator pause"
    limit = decision("rollback", {"rule": "failure limit", "failures": 3, "limit": 2}, {"gate": "ece"})
    assert data.rule_of(limit) == 'failure limit {"failures": 3, "limit": 2}'
    assert data.rule_of(decision("hold", {"gate": "ece"})) == ""


def test_window_lengths_count_and_share_each_served_and_suggested_window():
    accept = np.zeros((len(MODES), 4, 4), np.int64)
    suggest = np.zeros((len(MODES), 4, 4), np.int64)
    compact, shadow = MODES.index("compact"), MODES.index("shadow")
    accept[compact, 1, 0], accept[compact, 1, 1], accept[compact, 3, 2] = 2, 4, 2  # windows 1 (x6) and 3 (x2)
    accept[shadow, 3, 3] = 5
    suggest[shadow, 2, 1], suggest[shadow, 0, 3] = 3, 1
    frame = data.window_lengths(accept, suggest)
    rows = {(r["mode"], r["window"]): (r["requests"], r["share"]) for r in frame.to_dict("records")}
    assert rows == {
        ("compact", 1): (6, 0.75),
        ("compact", 3): (2, 0.25),
        ("shadow", 3): (5, 1.0),
        ("shadow (suggested)", 0): (1, 0.25),
        ("shadow (suggested)", 2): (3, 0.75),
    }


def test_depth_rows_are_sorted_and_split_the_interval():
    calibration = {
        "2": {"ece": 0.02, "ece_interval": [0.01, 0.03], "samples": 5},
        "10": {"ece": 0.1, "ece_interval": None, "samples": 1},
        "1": {"ece": 0.01, "ece_interval": [0.0, 0.02], "samples": 9},
    }
    frame = data.depth_table(calibration)
    assert list(frame["depth"]) == [1, 2, 10] and "ece_interval" not in frame
    assert list(frame["ece_lo"][:2]) == [0.0, 0.01] and list(frame["ece_hi"][:2]) == [0.02, 0.03]
    assert frame[["ece_lo", "ece_hi"]].iloc[2].isna().all()  # no interval for that depth
    assert list(data.depth_table({}).columns) == ["depth"]
    assert data.Overview({"steps": 0}, None, None).empty and not data.Overview({"steps": 3}, 1.0, 2.0).empty


@pytest.mark.parametrize(("key", "known"), [("replica", ["r0", "r1"]), ("task", ["code", "prose"])])
def test_slice_values_are_the_stored_ones(fixture_store, key, known):
    from sparkgate.dashboards.source import open_snapshot_reader

    reader = open_snapshot_reader(fixture_store.snapshot_dir)
    assert data.values(reader, reader.token, key, None, None) == known  # the known store's (tests/dashboards)


def test_a_stage_held_past_the_decisions_shown_keeps_the_change_in_force(tmp_path, monkeypatch):
    import dataclasses

    from sparkgate.collectors.store import Store
    from sparkgate.controller import ledger, rollout
    from sparkgate.controller.rollout_state import apply
    from sparkgate.dashboards.source import open_db_copy
    from sparkgate.policies.rollout import parse_rollout_policy

    monkeypatch.setattr(data, "MAX_DECISIONS", 5)
    policy = parse_rollout_policy({"canary_steps": [0.25]})
    with Store(tmp_path / "s.duckdb") as store:
        first = rollout.start(policy, 1.75e9)
        promote = rollout.command(policy, apply(None, first), "promote", "ops", 1.75e9 + 1)  # to shadow
        for decision in (first, promote):
            ledger.record(store, decision)
        hold = dataclasses.replace(promote, action="hold", outcome="inconclusive", operator=None,
                                   phase_from=promote.phase_to, reasons=({"rule": "hold"},))  # fmt: skip
        for i in range(8):
            ledger.record(store, dataclasses.replace(hold, decided_at=1.75e9 + 2 + i))
    source = open_db_copy(tmp_path / "s.duckdb")
    shown = data.ledger_view(source, source.token, policy)["decisions"]
    assert len(shown) == 6 and [d["action"] for d in shown[:2]] == ["promote", "hold"]
    assert data.latest_change(shown)["phase_to"] == "shadow"
