"""Explode validated request rows into per-depth labels (docs/design.md §2).

For a request in a step with block size γ, let ``v = γ, r = a*`` when the full
block was verified (static, shadow, cap_accept), else ``v = w, r = a`` (compact).
Depth k (1 <= k <= γ) gets exactly one status:

- ``accepted``     k <= r                    (y_k = 1)
- ``rejected``     k == r + 1 <= v           (y_k = 0)
- ``not_at_risk``  r < v and k > r + 1       (prefix already broke: y_k = 0)
- ``censored``     r == v and k > v          (never verified: y_k unknown, null)
- ``estimated``    a censored k == v + 1 of a sampled request (temperature > 0) whose
                   row carries ``next_accept_prob``: y_k is still unknown (null), and
                   ``probability`` holds P(y_k = 1), which the target's distribution at
                   that depth gives exactly

Later steps of a request can settle its censored labels (``recovered``; greedy
requests, ``collectors.recovery``), which the store does once both rows are in.

The input must have passed ``collectors.validate``: list lengths equal γ, and a*
is present wherever the mode verified the full block.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgate.collectors.schema import LABEL_SCHEMA, MODES, STATUSES
from sparkgate.collectors.wire import Flat
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

ACCEPTED, REJECTED, NOT_AT_RISK, CENSORED, RECOVERED, ESTIMATED = range(len(STATUSES))


def status_codes(depth: np.ndarray, verified: np.ndarray, reached: np.ndarray) -> np.ndarray:
    """Status code per label from depth k, verified length v and accepted length r (all broadcast)."""
    return np.where(
        depth <= reached,
        ACCEPTED,
        np.where(
            depth == reached + 1,
            np.where(depth <= verified, REJECTED, CENSORED),
            np.where(reached < verified, NOT_AT_RISK, CENSORED),
        ),
    ).astype(np.int8)


def mode_codes(modes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Index of each mode in ``MODES`` (modes are validated, so every value is found)."""
    return pc.index_in(modes, pa.array(MODES)).to_numpy(zero_copy_only=False).astype(np.int32)


def _dictionary(codes: np.ndarray, values: tuple[str, ...] | pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values, pa.string()))


def explode(flat: Flat) -> pa.Table:
    """One ``LABEL_SCHEMA`` row per (request row, depth), in request order then depth order."""
    steps, reqs = flat.steps, flat.requests
    gamma = steps.column("gamma").to_numpy()[flat.parent]
    mode = mode_codes(reqs.column("mode"))
    full_block = np.isin(mode, [MODES.index(m) for m in FULL_BLOCK_MODES])
    window = reqs.column("window").to_numpy()
    accepted = reqs.column("accepted").to_numpy()
    full_accept = pc.fill_null(reqs.column("full_accept"), 0).to_numpy()
    verified = np.where(full_block, gamma, window)
    reached = np.where(full_block, full_accept, accepted)

    owner = np.repeat(np.arange(reqs.num_rows), gamma)
    starts = np.concatenate([[0], np.cumsum(gamma)[:-1]])
    depth = (np.arange(len(owner)) - starts[owner] + 1).astype(np.int16)
    status = status_codes(depth, verified[owner], reached[owner])
    prob_column = reqs.column("next_accept_prob")
    if prob_column.null_count < len(prob_column):
        given = pc.fill_null(prob_column, np.nan).to_numpy(zero_copy_only=False).copy()
        given[reqs.column("temperature").to_numpy() <= 0] = np.nan  # greedy rows are recovered, not estimated
        probability = given[owner]
        estimated = (status == CENSORED) & (depth == verified[owner] + 1) & ~np.isnan(probability)
        status[estimated] = ESTIMATED
        probabilities = pa.array(probability, mask=~estimated)
    else:  # the common case, kept free of per-label work
        estimated = np.zeros(len(status), bool)
        probabilities = pa.nulls(len(status), pa.float64())
    unknown = (status == CENSORED) | estimated

    replica = pc.dictionary_encode(steps.column("replica_id")).combine_chunks()
    step_of = flat.parent[owner]
    columns = {
        "replica_id": pa.DictionaryArray.from_arrays(
            pa.array(replica.indices.to_numpy()[step_of], pa.int32()), replica.dictionary
        ),
        "step_id": pa.array(steps.column("step_id").to_numpy()[step_of]),
        "ts": pa.array(steps.column("ts").to_numpy()[step_of]),
        # A dictionary over the request rows' ids: no string is copied per depth.
        "request_id": pa.DictionaryArray.from_arrays(
            pa.array(owner, pa.int32()), reqs.column("request_id").combine_chunks()
        ),
        "mode": _dictionary(mode[owner], MODES),
        "depth": pa.array(depth),
        "status": _dictionary(status.astype(np.int32), STATUSES),
        "confidence": pc.list_flatten(reqs.column("confidence")),
        "survival": pc.list_flatten(reqs.column("survival")),
        "label": pa.array(status == ACCEPTED, mask=unknown),
        "probability": probabilities,
    }
    return pa.table(columns, schema=LABEL_SCHEMA)
