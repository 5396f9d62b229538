"""Censored-label recovery against full verification, on simulated greedy requests through a real store.

A greedy target's continuation of a request is a fixed token sequence (lossless verification commits its
argmax at every position), so a simulated request is that sequence, drafts that match it with some
probability, and steps that verify random windows: what full verification would label at each depth is
known exactly, whatever the window was.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.schema import RequestRow, StepRecord
from sparkgate.collectors.store import Store
from sparkgate.collectors.wire import from_records
from tests.collectors.strategies import step

GAMMA = 5


@dataclasses.dataclass
class Simulated:
    records: list[StepRecord]
    truth: dict[tuple[str, int, int], bool]  # (request, step, depth) -> the label full verification gives
    committed_to: dict[str, int]  # request -> one past the last position it committed


def simulate(seed: int, requests: int = 3, steps: int = 6, match: float = 0.7, temperature: float = 0.0) -> Simulated:
    rng = random.Random(seed)
    sequences = {f"q{i}": [rng.randrange(50) for _ in range(200)] for i in range(requests)}
    position = dict.fromkeys(sequences, 10)
    records, truth = [], {}
    for step_id in range(steps):
        rows = []
        for rid, tokens in sequences.items():
            p = position[rid]
            drafts = [tokens[p + j] if rng.random() < match else 50 + rng.randrange(5) for j in range(GAMMA)]
            full = next((j for j in range(GAMMA) if drafts[j] != tokens[p + j]), GAMMA)
            window = rng.choice([0, 1, 2, 3, GAMMA])
            accepted = min(full, window)
            censored = accepted == window < GAMMA
            committed = tokens[p : p + accepted + 1]
            rows.append(RequestRow(
                request_id=rid, mode="compact", task="chat", temperature=temperature, window_suggested=window,
                window=window, accepted=accepted, full_accept=None if censored else accepted, cap_trim=0,
                confidence=[0.8] * GAMMA, survival=[0.8 ** (k + 1) for k in range(GAMMA)],
                committed_tokens=committed, draft_tokens=drafts, position=p,
                next_accept_prob=(1.0 if drafts[window] == tokens[p + window] else 0.0) if censored else None,
            ))  # fmt: skip
            truth.update({(rid, step_id, k): k <= full for k in range(1, GAMMA + 1)})
            position[rid] = p + accepted + 1
        records.append(step(step_id=step_id, gamma=GAMMA, requests=rows))
    return Simulated(records, truth, position)


def labels(store: Store) -> dict[tuple[str, int, int], tuple[str, bool | None]]:
    rows = store.query("SELECT request_id, step_id, depth, status::VARCHAR AS status, label FROM depth_labels")
    return {(r["request_id"], r["step_id"], r["depth"]): (r["status"], r["label"]) for r in rows.to_pylist()}


def joined(tmp_path, sim: Simulated) -> list[dict]:
    """Every label of ``sim`` ingested in order, beside its request row's position, window and accepted."""
    with Store(tmp_path / "events.duckdb") as store:
        ingest_in(store, sim.records, list(range(len(sim.records))), [])
        return store.query(
            'SELECT l.request_id, l.step_id, l.depth, r.position, r."window", r.accepted, l.status::VARCHAR AS status, '
            "l.label, l.probability FROM depth_labels l JOIN requests r USING (replica_id, step_id, request_id)"
        ).to_pylist()


def ingest_in(store: Store, records: list[StepRecord], order: list[int], cuts: list[int]) -> None:
    """Ingest ``records`` in ``order``, committed in batches cut at ``cuts``."""
    shuffled = [records[i] for i in order]
    bounds = [0, *sorted(set(cuts)), len(shuffled)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            assert store.ingest(from_records(shuffled[a:b]), "test").quarantined == 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_recovered_labels_equal_full_verification_in_any_ingestion_order(tmp_path_factory, seed, data):
    sim = simulate(seed)
    order = data.draw(st.permutations(range(len(sim.records))))
    cuts = data.draw(st.lists(st.integers(1, len(sim.records) - 1), max_size=3))
    with Store(tmp_path_factory.mktemp("in_order") / "a.duckdb") as in_order:
        ingest_in(in_order, sim.records, list(range(len(sim.records))), [])
        expected = labels(in_order)
    with Store(tmp_path_factory.mktemp("any_order") / "b.duckdb") as any_order:
        ingest_in(any_order, sim.records, list(order), cuts)
        assert labels(any_order) == expected  # out of order, in any batches: the same labels
    recovered = 0
    for key, (status, label) in expected.items():
        if status != "censored":
            assert label == sim.truth[key], key  # every label, observed or recovered, is full verification's
        recovered += status == "recovered"
    assert recovered  # the simulation leaves something to recover at every seed


def test_a_label_is_never_recovered_from_tokens_not_yet_committed(tmp_path):
    sim = simulate(3, requests=4, steps=8, match=0.95)
    rows = joined(tmp_path, sim)
    censored = [r for r in rows if r["status"] == "censored"]
    assert censored  # drafts that keep matching run past the last step
    for r in rows:
        needs = r["position"] + r["depth"]  # depth k is settled by the token at position + k - 1
        if r["status"] == "recovered" and r["depth"] > r["window"]:
            assert (
                needs <= sim.committed_to[r["request_id"]] or not sim.truth[(r["request_id"], r["step_id"], r["depth"])]
            )
    for r in censored:
        assert r["position"] + r["depth"] > sim.committed_to[r["request_id"]]  # unresolved only past the stream


def test_sampled_requests_are_estimated_at_the_next_depth_and_never_recovered(tmp_path):
    sim = simulate(5, temperature=0.7)
    rows = [r for r in joined(tmp_path, sim) if r["accepted"] == r["window"] < GAMMA]
    assert rows and not any(r["status"] == "recovered" for r in rows)
    for r in rows:
        if r["depth"] == r["window"] + 1:
            assert r["status"] == "estimated" and r["label"] is None and r["probability"] in (0.0, 1.0)
        elif r["depth"] > r["window"]:
            assert r["status"] == "censored" and r["probability"] is None


def test_an_observed_label_is_never_overwritten_even_by_tokens_that_contradict_it(tmp_path):
    sim = simulate(11)
    # Every row verified in full (cap_accept, a* observed) while its drafts and later tokens are scrambled:
    # recovery would settle these depths differently, were it to touch an observed label.
    observed = [
        dataclasses.replace(r, requests=[
            dataclasses.replace(q, mode="cap_accept", full_accept=q.window, cap_trim=0, next_accept_prob=None,
                                accepted=q.window, committed_tokens=[7] * (q.window + 1), draft_tokens=[99] * GAMMA)
            for q in r.requests
        ])
        for r in sim.records
    ]  # fmt: skip
    with Store(tmp_path / "events.duckdb") as store:
        ingest_in(store, observed, list(range(len(observed))), [])
        found = labels(store)
    assert found and not any(status in ("censored", "recovered") for status, _ in found.values())


def engine_records(target, mode: str, temperature: float) -> list[StepRecord]:
    from sparkgate.verify_runtime.drafters import ModelDrafter
    from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
    from tests.conftest import SurvivalWindows

    records: list[StepRecord] = []
    config = EngineConfig(gamma=4, max_batch=3)
    engine = Engine(target, ModelDrafter(target, noise=1.5), config, policy=SurvivalWindows(), sink=records.append)
    for i in range(6):
        prompt = [i, 2 * i + 1, 7]
        engine.submit(Request(f"r{i}", prompt, 24, temperature=temperature, seed=i, mode=mode, stop_at_eos=False))
    engine.run()
    return records


def stored_labels(tmp_path, name: str, records: list[StepRecord]) -> dict:
    with Store(tmp_path / f"{name}.duckdb") as store:
        assert store.ingest(from_records(records), name).quarantined == 0
        return labels(store)


def test_the_engines_recovered_labels_agree_with_what_full_verification_observed(tmp_path, target):
    """The same greedy requests and windows in compact and in cap_accept (which verifies the whole block):
    every label compact recovered is the one cap_accept observed."""
    compact = stored_labels(tmp_path, "compact", engine_records(target, "compact", 0.0))
    full = stored_labels(tmp_path, "cap", engine_records(target, "cap_accept", 0.0))
    assert compact.keys() == full.keys()
    recovered = [key for key, (status, _) in compact.items() if status == "recovered"]
    assert recovered and all(compact[key][1] == full[key][1] for key in recovered)
    censored = [key for key, (status, _) in compact.items() if status == "censored"]
    assert len(recovered) >= 0.9 * (len(recovered) + len(censored))  # what stays is the requests' last steps


def test_the_engines_estimates_match_the_acceptance_full_verification_draws(tmp_path, target):
    """Sampled requests: compact's estimated P(y = 1) at the depth past its window against cap_accept's
    observed label there (the same uniforms): the mean probability matches the rate of acceptances."""
    compact = stored_labels(tmp_path, "compact", engine_records(target, "compact", 0.9))
    full = stored_labels(tmp_path, "cap", engine_records(target, "cap_accept", 0.9))
    with Store(tmp_path / "compact.duckdb") as store:
        rows = store.query(
            "SELECT request_id, step_id, depth, probability FROM depth_labels WHERE status = 'estimated'"
        ).to_pylist()
    assert len(rows) >= 20
    probability = sum(r["probability"] for r in rows) / len(rows)
    rate = sum(full[(r["request_id"], r["step_id"], r["depth"])][1] for r in rows) / len(rows)
    assert abs(probability - rate) <= 3 * (probability * (1 - probability) / len(rows)) ** 0.5 + 0.02
    assert not any(status == "recovered" for status, _ in compact.values())


def test_on_the_shipped_models_recovery_is_exact_covers_what_resolves_and_keeps_ece_within_cap_accepts():
    from tests.recovery_measure import measure

    found = measure(requests=24, new_tokens=48, seed=0)
    assert found["recovered"] > 500 and found["exactness"] == 1.0
    assert found["coverage_of_resolvable"] >= 0.95  # what is left is past the requests' last commit
    assert all(d["within"] for d in found["ece_by_depth"].values())
    assert (
        found["label_yield"]["compact"]["per_verify_row_with_recovery"]
        > found["label_yield"]["cap_accept"]["per_verify_row"]
    )
