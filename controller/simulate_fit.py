"""The simulator's fleet model fitted to the runtime, and the check of the one against the other
(``sparkgate simulate-fit``, docs/design.md §6).

From a store the shipped runtime wrote (a ``sparkgate demo`` run on this machine), the fit keeps:

- ``conditionals``: a seeded sample of full-block request rows' calibrated conditional confidences
  ``c_k = S_k / S_{k-1}``, which the simulator's rows report, and ``reliability``: per depth and bin of
  c_k the acceptance rate the runtime showed over the rows at risk, the simulator's true acceptance (so
  its healthy fleet is as well or as badly calibrated as the runtime);
- the step-time models, of wall time (``wall``) and of the replica's CPU time (``cpu``): ``fixed_ms +
  per_row_ms × verify_rows`` by least squares over the steps, the sd of the log residual within a
  switchback epoch (``step_sd``) and across epochs beyond what the steps' own noise explains
  (``noise_sd``); and the per-replica batch size and step rate.

``check`` draws records from the fitted model and compares them with the store's: per depth the
two-sample Kolmogorov–Smirnov statistic of S_k and the label rates, the KS statistic of a* and of the
step time at the runtime's own batch sizes and rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import RowModel
from sparkgate.policies import json_text
from sparkgate.policies.binning import N_BINS, bin_index
from sparkgate.policies.errors import InputError
from sparkgate.policies.outputs import output_path, written_whole
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

FIT_PATH = Path(__file__).with_name("assets") / "simulate_fit.json"
SAMPLE_ROWS = 1000
MIN_BIN_ROWS = 20  # below this a bin's acceptance rate is its mean confidence (calibrated)
_FULL = ", ".join(f"'{m}'" for m in FULL_BLOCK_MODES)


def fit(store: Store) -> dict:
    """The fleet model of ``store``'s records (raises ``ValueError`` naming what it lacks)."""
    table = store.query(
        f"SELECT survival, full_accept FROM requests WHERE mode::VARCHAR IN ({_FULL}) AND full_accept IS NOT NULL"
    )
    if table.num_rows < 100:
        raise ValueError(f"the store has {table.num_rows} full-block request rows; the fit needs at least 100")
    survival = np.array(table.column("survival").to_pylist(), dtype=np.float64)
    full = table.column("full_accept").to_numpy()
    conditionals = _conditionals(survival)
    gamma = survival.shape[1]
    # Per depth and bin of c_k, over the rows at risk there (a* >= k - 1): how often depth k was accepted.
    reliability = np.zeros((gamma, N_BINS))
    for d in range(gamma):
        risk = full >= d
        b = bin_index(conditionals[risk, d])
        n = np.bincount(b, minlength=N_BINS)
        accepted = np.bincount(b, full[risk] > d, minlength=N_BINS)
        mean_c = np.bincount(b, conditionals[risk, d], minlength=N_BINS) / np.maximum(n, 1)
        centre = (np.arange(N_BINS) + 0.5) / N_BINS
        reliability[d] = np.where(n >= MIN_BIN_ROWS, accepted / np.maximum(n, 1), np.where(n > 0, mean_c, centre))
    sample = np.random.default_rng(0).choice(len(conditionals), min(SAMPLE_ROWS, len(conditionals)), replace=False)
    steps = store.query(
        "SELECT replica_id, coalesce(epoch, -1) AS epoch, coalesce(arm, '') AS arm, batch_size, verify_rows, "
        "step_ms, coalesce(step_cpu_ms, step_ms) AS step_cpu_ms, ts FROM steps"
    )
    keys = [steps.column(c).to_pylist() for c in ("replica_id", "epoch", "arm")]
    replica = np.unique(np.array(keys[0]), return_inverse=True)[1]
    ts = steps.column("ts").to_numpy()
    rates = [(replica == r).sum() / max(float(np.ptp(ts[replica == r])), 1e-9) for r in range(replica.max() + 1)]
    verify_rows = steps.column("verify_rows").to_numpy()
    wall, cpu = (_step_model(verify_rows, steps.column(c).to_numpy(), keys) for c in ("step_ms", "step_cpu_ms"))
    return {
        "gamma": gamma,
        "rows": len(survival),
        "conditionals": conditionals[np.sort(sample)].tolist(),
        "reliability": np.round(reliability, 5).tolist(),
        "wall": wall,
        "cpu": cpu,
        "batch": round(float(steps.column("batch_size").to_numpy().mean()), 2),
        "steps_per_s": round(float(np.median(rates)), 3),
    }


def _step_model(rows: np.ndarray, ms: np.ndarray, keys: list[list]) -> dict:
    """``ms = fixed + per_row × rows`` by least squares; the log residual's sd within a (replica, epoch,
    arm) and the sd of epoch means beyond what their steps' own noise gives them."""
    # Steps that all verified as many rows say nothing of the per-row cost: the fixed part is their mean.
    per_row, fixed = np.polyfit(rows, ms, 1) if np.ptp(rows) > 0 else (0.0, float(np.mean(ms)))
    residual = np.log(ms / np.maximum(fixed + per_row * rows, 1e-3))
    _, epoch_of = np.unique(np.array([f"{r}|{e}|{m}" for r, e, m in zip(*keys)]), return_inverse=True)
    in_epoch = np.array(keys[1]) >= 0
    within, between = float(residual.std()), 0.0
    if in_epoch.any():
        groups = epoch_of[in_epoch]
        sizes = np.bincount(groups)
        used = sizes > 1
        means = np.bincount(groups, residual[in_epoch]) / np.maximum(sizes, 1)
        squares = np.bincount(groups, residual[in_epoch] ** 2) / np.maximum(sizes, 1)
        sd = np.sqrt(np.maximum(squares - means**2, 0) * sizes / np.maximum(sizes - 1, 1))
        within = float(np.median(sd[used]))
        if used.sum() > 2:
            between = float(max(means[used].var() - (within**2 / sizes[used]).mean(), 0.0)) ** 0.5
    return {"fixed_ms": round(float(fixed), 4), "per_row_ms": round(float(per_row), 6),
            "step_sd": round(within, 4), "noise_sd": round(between, 4)}  # fmt: skip


def _conditionals(survival: np.ndarray) -> np.ndarray:
    """``c_k = S_k / S_{k-1}`` (``S_0 = 1``), in [0, 1]."""
    previous = np.concatenate([np.ones((len(survival), 1)), survival[:, :-1]], axis=1)
    return np.clip(np.divide(survival, previous, out=np.zeros_like(survival), where=previous > 0), 0, 1)


def row_model(model: dict, confidence_scale: float = 1.0) -> RowModel:
    """How the fitted model draws rows (every mode alike)."""
    return RowModel(None, None, confidence_scale, np.asarray(model["conditionals"]), np.asarray(model["reliability"]))


class FitFileError(InputError):
    """A file that is not a fitted fleet model (named in the message, with what is wrong)."""


_STEP_MODEL = ("fixed_ms", "per_row_ms", "step_sd", "noise_sd")


def load(path: str | Path = FIT_PATH) -> dict:
    """A fitted model as ``fit`` writes it; ``FitFileError`` naming the file and the first key that is not
    what the simulator draws from (probabilities in [0, 1], γ columns, finite step-time figures)."""
    try:
        model = json_text.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FitFileError(f"{path}: not a fitted fleet model (not JSON: {exc})") from None
    problem = _problem(model)
    if problem:
        raise FitFileError(f"{path}: not a fitted fleet model ({problem}); `sparkgate simulate-fit --out` writes one")
    return model


def _problem(model: object) -> str | None:
    if not isinstance(model, dict):
        return "expected a JSON object"
    gamma = model.get("gamma")
    if type(gamma) is not int or gamma < 1:
        return f"gamma: expected an integer >= 1, got {gamma!r}"
    if type(model.get("rows")) is not int or model["rows"] < 0:
        return f"rows: expected a count, got {model.get('rows')!r}"
    for key, columns in (("conditionals", gamma), ("reliability", N_BINS)):
        try:
            table = np.asarray(model.get(key), dtype=np.float64)
        except (TypeError, ValueError):
            return f"{key}: expected a table of numbers"
        if table.ndim != 2 or not len(table) or table.shape[1] != columns or not np.all((table >= 0) & (table <= 1)):
            return f"{key}: expected rows of {columns} probabilities in [0, 1]"
    for part in ("wall", "cpu"):
        figures = model.get(part)
        if not isinstance(figures, dict) or not all(
            isinstance(figures.get(k), int | float) and np.isfinite(figures[k]) and figures[k] >= 0 for k in _STEP_MODEL
        ):
            return f"{part}: expected {', '.join(_STEP_MODEL)} as finite numbers >= 0"
    return None


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov–Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    if not len(a) or not len(b):
        return float("nan")
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


def check(store: Store, model: dict, rows: int = 20_000, seed: int = 0) -> dict:
    """Records drawn from ``model`` against ``store``'s: KS per depth of S_k, label rates, a*, step time."""
    rng = np.random.default_rng(seed)
    gamma = model["gamma"]
    real = store.query(
        f"SELECT survival, full_accept FROM requests WHERE mode::VARCHAR IN ({_FULL}) AND full_accept IS NOT NULL"
    )
    real_s = np.array(real.column("survival").to_pylist(), dtype=np.float64)
    real_a = real.column("full_accept").to_numpy()
    truth, confidence = row_model(model).draw(rng, rows, gamma)
    sim_s = np.cumprod(confidence, axis=1)
    survived = rng.random((rows, gamma)) < truth
    sim_a = np.where(survived.all(axis=1), gamma, np.argmin(survived, axis=1))
    depths = {}
    for d in range(gamma):
        real_rate, sim_rate = float((real_a > d).mean()), float((sim_a > d).mean())
        depths[str(d + 1)] = {
            "ks_survival": round(ks(real_s[:, d], sim_s[:, d]), 4),
            "label_rate": round(real_rate, 4),
            "label_rate_simulated": round(sim_rate, 4),
            "label_rate_se": round(float(np.sqrt(real_rate * (1 - real_rate) / len(real_a))), 4),
        }
    steps = store.query("SELECT verify_rows, step_ms, coalesce(step_cpu_ms, step_ms) AS step_cpu_ms FROM steps")
    rows_ = steps.column("verify_rows").to_numpy()
    step_ks = {}
    for name, column in (("wall", "step_ms"), ("cpu", "step_cpu_ms")):
        m = model[name]
        noise = rng.normal(0, np.hypot(m["step_sd"], m["noise_sd"]), len(rows_))
        step_ks[name] = round(
            ks(steps.column(column).to_numpy(), (m["fixed_ms"] + m["per_row_ms"] * rows_) * np.exp(noise)), 4
        )
    return {
        "rows": {"runtime": len(real_a), "simulated": rows},
        "depths": depths,
        "ks_survival_max": max(v["ks_survival"] for v in depths.values()),
        "ks_accepted_length": round(ks(real_a, sim_a), 4),
        "ks_step_time": step_ks,
        "steps": len(rows_),
    }


@click.command("simulate-fit")
@click.option("--db", "db", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A store the runtime wrote (e.g. sparkgate-demo/demo.duckdb).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the fitted model here (what simulate --fit reads).")  # fmt: skip
@click.option("--fit", "fit_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Check this fitted model instead of fitting one.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def simulate_fit(db: str, out: str | None, fit_path: str | None, as_json: bool) -> None:
    """Fit the simulator's fleet model to a runtime's records, and check the model against them (KS)."""
    given = load(fit_path) if fit_path else None  # a bad file is named before the store is opened
    if out:
        output_path(out, "--out")
    with Store(db, create=False) as store:
        try:
            model = given or fit(store)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        shown = {k: v for k, v in model.items() if k not in ("conditionals", "reliability")}
        result = {"model": shown, "check": check(store, model)}
    if out:
        with written_whole(out) as partial:
            partial.write_text(json.dumps(model) + "\n")
    click.echo(json.dumps(result) if as_json else json.dumps(result, indent=1))
