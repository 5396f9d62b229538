"""``sparkgate simulate-fit``: the fleet model fitted to a runtime's records, and its check (KS)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import ks_2samp

from sparkgate.cli import main
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import RowModel, synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.controller.simulate_fit import FIT_PATH, check, fit, ks, load


def test_ks_is_the_two_sample_kolmogorov_smirnov_statistic():
    rng = np.random.default_rng(0)
    for a, b in ((rng.normal(0, 1, 300), rng.normal(0.2, 1, 500)), (rng.integers(0, 4, 200), rng.integers(0, 5, 90))):
        assert ks(a, b) == pytest.approx(ks_2samp(a, b).statistic)


def _store(path, scale: float) -> Store:
    store = Store(path)
    model = RowModel(mode_weights=(1.0, 0.0, 0.0, 0.0), confidence_scale=scale)  # static rows, full labels
    for i in range(6):
        wire = synthetic_wire(100, 16, 7, f"r{i % 2}", first_step=i * 100, seed=i, ts=1e9 + i * 5, model=model)
        store.ingest(from_wire(wire), "test")
    return store


def test_the_fit_reproduces_a_calibrated_runtime_and_learns_a_miscalibrated_ones_acceptance(tmp_path):
    with _store(tmp_path / "calibrated.duckdb", 1.0) as store:
        model = fit(store)
        found = check(store, model)
    assert model["gamma"] == 7 and model["rows"] == 9600 and len(model["conditionals"]) == 1000
    assert found["ks_survival_max"] < 0.06 and found["ks_accepted_length"] < 0.03
    for depth in found["depths"].values():  # labels drawn from the fitted acceptance match the runtime's
        assert abs(depth["label_rate"] - depth["label_rate_simulated"]) < 5 * depth["label_rate_se"] + 0.01
    with _store(tmp_path / "overconfident.duckdb", 1.25) as store:
        skewed = fit(store)
    # Confidences 1.25 × the truth: the fitted acceptance at a bin of c is about c / 1.25.
    rates = np.asarray(skewed["reliability"])[0]
    assert rates[10] == pytest.approx((10.5 / 15) / 1.25, abs=0.05)


def test_the_command_writes_the_fit_and_refuses_a_store_without_enough_rows(tmp_path):
    with _store(tmp_path / "runtime.duckdb", 1.0):
        pass
    out = tmp_path / "fit.json"
    result = CliRunner().invoke(main, ["simulate-fit", "--db", str(tmp_path / "runtime.duckdb"), "--out", str(out),
                                       "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert set(body) == {"model", "check"} and "conditionals" not in body["model"]
    assert load(out)["wall"]["per_row_ms"] == body["model"]["wall"]["per_row_ms"]
    with Store(tmp_path / "empty.duckdb"):
        pass
    empty = CliRunner().invoke(main, ["simulate-fit", "--db", str(tmp_path / "empty.duckdb")])
    assert empty.exit_code != 0 and "full-block request rows; the fit needs at least 100" in empty.output


def test_the_shipped_fit_is_a_runtimes():
    shipped = load(FIT_PATH)
    assert shipped["gamma"] == 7 and len(shipped["conditionals"]) == 1000 and shipped["rows"] >= 1000
    assert 0 < shipped["cpu"]["noise_sd"] < shipped["wall"]["noise_sd"]  # shared cores: wall time is noisier


def _shipped() -> dict:
    return json.loads(FIT_PATH.read_text())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: "not json", "not JSON: Expecting value"),
        (lambda m: [m], "expected a JSON object"),
        (lambda m: {**m, "gamma": 0}, "gamma: expected an integer >= 1, got 0"),
        (lambda m: {k: v for k, v in m.items() if k != "rows"}, "rows: expected a count, got None"),
        (lambda m: {**m, "conditionals": [row[:-1] for row in m["conditionals"]]}, "conditionals: expected rows of 7"),
        (lambda m: {**m, "conditionals": []}, "conditionals: expected rows of 7 probabilities in [0, 1]"),
        (lambda m: {**m, "reliability": [[1.5] * 15] * 7}, "reliability: expected rows of 15 probabilities"),
        (lambda m: {**m, "reliability": "high"}, "reliability: expected a table of numbers"),
        (lambda m: {**m, "wall": {**m["wall"], "step_sd": -1}}, "wall: expected fixed_ms, per_row_ms, step_sd, noise"),
        (lambda m: {**m, "cpu": None}, "cpu: expected fixed_ms, per_row_ms, step_sd, noise_sd as finite numbers"),
    ],
)
def test_a_file_that_is_not_a_fitted_model_is_named_by_simulate(tmp_path, change, named):
    bad = tmp_path / "fit.json"
    changed = change(_shipped())
    bad.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    argv = ["simulate", "--policy", "policies/default_rollout.yaml", "--seeds", "1", "--fit", str(bad)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.startswith(f"Error: {bad}: not a fitted fleet model (") and named in result.output
    assert len(result.output.splitlines()) == 1


def test_simulate_fit_names_a_bad_fit_file_or_output_before_it_opens_the_store(tmp_path):
    db = tmp_path / "runtime.duckdb"
    with Store(db):
        pass
    before = db.read_bytes()
    (tmp_path / "file").write_text("a regular file")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    for extra, code, named in [
        (["--fit", str(bad)], 1, f"Error: {bad}: not a fitted fleet model (expected a JSON object)"),
        (["--out", str(tmp_path / "file" / "fit.json")], 2, "Invalid value for '--out'"),
    ]:
        result = CliRunner().invoke(main, ["simulate-fit", "--db", str(db), *extra])
        assert result.exit_code == code and named in result.output, result.output
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "file", db.name]
