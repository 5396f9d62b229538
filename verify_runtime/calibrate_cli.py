"""``sparkgate calibrate``: fit STS temperatures from step records (NDJSON, docs/design.md §4).

Only full-block rows (``static``, ``shadow``, ``cap_accept``) are used: their
``full_accept`` a* gives every depth's label ``y_k = 1[a* >= k]``. Compact rows
are left out because their labels are censored exactly where confidence was low,
which would bias the fit. Records whose confidences were calibrated where they
were produced (``sts_version`` ``calibrated-at-source``: an SGLang server's) are
refused: fitting on them would stack a second calibration on the server's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import click
import torch

from sparkgate.collectors.schema import CALIBRATED_AT_SOURCE, StepRecord
from sparkgate.policies import json_text
from sparkgate.policies.outputs import output_path, written_whole
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

T = TypeVar("T")


def _agree(where: str, name: str, value: T, first: T | None) -> T:
    """``value``, which must equal the ``first`` record's (None: this is the first)."""
    if first is not None and value != first:
        raise ValueError(f"{where}: {name}={value}, earlier records have {name}={first}")
    return value


def read_labels(paths: list[str | Path]) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Raw confidences ``[N, γ]`` and survival labels ``[N, γ]`` of the full-block rows in ``paths``, and
    the drafter version they all came from (one STS fits one drafter: mixed drafters are refused)."""
    confidence, labels, gamma, drafter = [], [], None, None
    for path in paths:
        try:
            text = Path(path).read_text()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = StepRecord.from_dict(json_text.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{where}: not a step record ({exc})") from exc
            if record.sts_version == CALIBRATED_AT_SOURCE:
                raise ValueError(
                    f"{where}: sts_version={CALIBRATED_AT_SOURCE}: these confidences were already calibrated by "
                    "the server that produced them; fit STS where raw confidences are recorded"
                )
            if type(record.gamma) is not int or record.gamma < 1:
                raise ValueError(f"{where}: gamma={record.gamma!r} is not an integer >= 1")
            # One STS file calibrates one drafter at one gamma.
            drafter = _agree(where, "drafter_version", record.drafter_version, drafter)
            gamma = _agree(where, "gamma", record.gamma, gamma)
            for i, row in enumerate(record.requests):
                if row.mode not in FULL_BLOCK_MODES:
                    continue
                if not isinstance(row.confidence, list):
                    raise ValueError(f"{where}: requests[{i}].confidence={row.confidence!r} is not a list")
                if len(row.confidence) != gamma:
                    raise ValueError(
                        f"{where}: requests[{i}].confidence has {len(row.confidence)} values, gamma={gamma}"
                    )
                if type(row.full_accept) is not int or not 0 <= row.full_accept <= gamma:
                    raise ValueError(f"{where}: requests[{i}].full_accept={row.full_accept!r} is not in [0, {gamma}]")
                for k, value in enumerate(row.confidence):
                    # A NaN fails both comparisons; ingest quarantines what this refuses.
                    if type(value) not in (int, float) or not 0 <= value <= 1:
                        raise ValueError(
                            f"{where}: requests[{i}].confidence[{k}]={value!r} is not a finite probability in [0, 1]"
                        )
                confidence.append(row.confidence)
                labels.append([float(row.full_accept >= k) for k in range(1, gamma + 1)])
    if not confidence:
        raise ValueError(f"no full-block ({', '.join(FULL_BLOCK_MODES)}) request rows in {', '.join(map(str, paths))}")
    return torch.tensor(confidence, dtype=torch.float64), torch.tensor(labels, dtype=torch.float64), drafter or ""


@click.command()
@click.option(
    "--records",
    "paths",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="NDJSON step records (repeatable).",
)
@click.option("--out", type=click.Path(dir_okay=False), help="Where to write the STS JSON.")
@click.option("--dataset", default=None, help="Name recorded in the file (default: the record file names).")
@click.option("--ship", is_flag=True, help="Install as the shipped STS (verify_runtime/assets/sts.json).")
def calibrate(paths, out, dataset, ship):
    """Fit per-depth STS temperatures (left to right, by the survival's log loss) and write SGLang's STS JSON."""
    from sparkgate.policies.calibration import fit_sts

    from .shipped import ship_sts

    if not out and not ship:
        raise click.UsageError("give --out PATH and/or --ship")
    if out:
        output_path(out, "--out")
    try:
        confidence, labels, drafter = read_labels(list(paths))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    sts = fit_sts(confidence, labels, dataset=dataset or ",".join(Path(p).name for p in paths), drafter=drafter)
    if out:
        with written_whole(out) as partial:
            sts.save(partial)
    if ship:
        ship_sts(sts)
    click.echo(json.dumps({**sts.to_dict(), "version": sts.version}))
