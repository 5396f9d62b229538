"""Request records from the real engine: valid, trimmed to the output given, cancellation frees everything,
and an epoch only for a request served wholly inside one."""

from __future__ import annotations

import pytest

from sparkgate.collectors.request_records import validate
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request


@pytest.fixture(scope="module")
def drafter(target):
    return ModelDrafter(target, noise=1.5)


def engine_with_log(target, drafter, **config):
    records = []
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=4, **config), request_sink=records.append)
    return engine, records


def test_every_finished_request_posts_one_valid_record_of_exactly_its_output(target, drafter):
    engine, records = engine_with_log(target, drafter)
    for i, n in enumerate((1, 5, 9)):
        engine.submit(Request(f"q{i}", [1, 2, 3], n, stop_at_eos=False, mode="compact"))
    outputs = engine.run()
    assert sorted(r.request_id for r in records) == ["q0", "q1", "q2"]
    for record in records:
        assert validate(record.to_dict()) == [], record
        assert record.output_tokens == len(outputs[record.request_id]) and record.finish_reason == "length"
        assert record.prompt_tokens == 3 and record.mode == "compact" and record.ttft_ms >= 0
        assert record.epoch is None and record.arm is None  # no switchback
    assert max(r.output_tokens for r in records) == 9  # trimmed to max_new_tokens, never past it


def test_a_cancelled_request_frees_its_slot_and_posts_a_whole_record(target, drafter):
    engine, records = engine_with_log(target, drafter)
    engine.submit(Request("run", [1, 2, 3], 40, stop_at_eos=False))
    engine.submit(Request("other", [4, 5], 40, stop_at_eos=False))
    engine.step()
    engine.step()
    free = engine.cache.free_slots
    assert engine.cancel("run") and not engine.cancel("run")  # once; then it is gone
    assert [r.request_id for r in engine.active] == ["other"] and engine.cache.free_slots == free + 1
    assert engine.finished["run"].past_survival == []
    record = records[-1]
    assert (record.request_id, record.finish_reason) == ("run", "cancelled") and validate(record.to_dict()) == []
    assert record.output_tokens == len(engine.finished["run"].output) > 0
    engine.submit(Request("queued", [1], 5))
    assert engine.cancel("queued")
    queued = records[-1]
    assert (queued.first_token_ts, queued.output_tokens, queued.commit_tokens) == (None, 0, [])
    assert validate(queued.to_dict()) == []
    engine.run()  # the rest goes on undisturbed
    assert [r.request_id for r in records] == ["run", "queued", "other"]


def test_only_a_request_served_inside_one_epoch_carries_it(target, drafter):
    engine, records = engine_with_log(target, drafter, epoch=3, arm="control")
    engine.submit(Request("inside", [1, 2], 2, stop_at_eos=False))
    engine.submit(Request("across", [1, 2], 30, stop_at_eos=False))
    engine.step()
    engine.step()
    engine.config.epoch, engine.config.arm = 4, "treatment"
    engine.run()
    by_id = {r.request_id: r for r in records}
    assert (by_id["inside"].epoch, by_id["inside"].arm) == (3, "control")
    assert (by_id["across"].epoch, by_id["across"].arm) == (None, None)
