"""Request records (event schema v2, docs/design.md §4): one per request that finished or was cancelled.

Where a step record says what one verify step cost, a request record says what
the person who sent the request saw: when it arrived, when its first token and
every later commit came, why it stopped. TTFT, TPOT, ITL and goodput are read
from them. ``validate`` names every problem of one record; a record is stored
whole or quarantined whole, never half written, and a (replica_id, request_id)
is stored once.

Invariants a valid record holds:
- ``arrival_ts <= first_token_ts <= finish_ts``; ``first_token_ts`` is null only
  for a request cancelled before its first commit;
- ``commit_offsets_ms`` (ms since arrival, one per commit) are non-decreasing
  and as many as ``commit_tokens`` (each >= 1), which sum to ``output_tokens``;
  the first offset is the TTFT;
- ``epoch`` and ``arm`` are both null or both set: set when the whole request,
  arrival to finish, was served inside one switchback epoch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkgate.collectors.schema import (
    MAX_ID_CHARS,
    MAX_UNIX_S,
    NOT_UNICODE,
    RECORD_PHASES,
    Problem,
    encodable,
    id_problem,
)
from sparkgate.policies.vocabulary import Arm, FinishReason, Mode

REQUEST_RECORD_VERSION = 2
# A commit offset may differ from first_token_ts - arrival_ts by rounding only.
_TTFT_TOLERANCE_MS = 1.0


@dataclass
class RequestRecord:
    replica_id: str
    request_id: str
    arrival_ts: float
    first_token_ts: float | None
    finish_ts: float
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    mode: str  # the mode of its first step
    phase: str
    policy_revision: int
    commit_offsets_ms: list[float]
    commit_tokens: list[int]
    epoch: int | None = None
    arm: str | None = None
    contract: str | None = None
    schema_version: int = REQUEST_RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def ttft_ms(self) -> float | None:
        return self.commit_offsets_ms[0] if self.commit_offsets_ms else None

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first: (last commit - first commit) / (tokens - first commit's)."""
        later = self.output_tokens - (self.commit_tokens[0] if self.commit_tokens else 0)
        if later <= 0:
            return None
        return (self.commit_offsets_ms[-1] - self.commit_offsets_ms[0]) / later


REQUEST_RECORD_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int64()),
        pa.field("replica_id", pa.string()),
        pa.field("request_id", pa.string()),
        pa.field("arrival_ts", pa.float64()),
        pa.field("first_token_ts", pa.float64()),
        pa.field("finish_ts", pa.float64()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("mode", pa.string()),
        pa.field("phase", pa.string()),
        pa.field("policy_revision", pa.int64()),
        pa.field("epoch", pa.int64()),
        pa.field("arm", pa.string()),
        pa.field("contract", pa.string()),
        pa.field("commit_offsets_ms", pa.list_(pa.float64())),
        pa.field("commit_tokens", pa.list_(pa.int64())),
        pa.field("ttft_ms", pa.float64()),
        pa.field("tpot_ms", pa.float64()),
    ]
)
NULLABLE = frozenset({"first_token_ts", "epoch", "arm", "contract"})
_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))
_STRINGS = ("replica_id", "request_id", "finish_reason", "mode", "phase", "contract")
_IDS = ("replica_id", "request_id")
# What an int64 column holds: a larger integer would fail the store's write, not name itself.
_INT64_MAX = 2**63 - 1
_TIMES = ("arrival_ts", "first_token_ts", "finish_ts")
_COUNTS = ("prompt_tokens", "output_tokens", "policy_revision", "epoch", "schema_version")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= _INT64_MAX


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _types(obj: dict[str, Any]) -> list[Problem]:
    problems = [
        Problem(k, None, "missing (required field)") for k in _FIELDS if obj.get(k) is None and k not in NULLABLE
    ]
    problems += [Problem(k, obj[k], "unknown field") for k in obj if k not in _FIELDS]
    for k in _STRINGS:
        value = obj.get(k)
        if value is None:
            continue
        if not (isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS):
            problems.append(Problem(k, value, f"expected a string of 1 to {MAX_ID_CHARS} characters"))
            continue
        # Ids follow the step records' rules; any other string must at least have a UTF-8 form.
        problem = id_problem(value) if k in _IDS else (None if encodable(value) else NOT_UNICODE)
        if problem is not None:
            problems.append(Problem(k, value, problem))
    for k in _TIMES:
        if obj.get(k) is not None and not (_is_number(obj[k]) and 0 <= obj[k] <= MAX_UNIX_S):
            problems.append(Problem(k, obj[k], "expected finite unix seconds in [0, 4102444800]"))
    for k in _COUNTS:
        if obj.get(k) is not None and not (_is_int(obj[k]) and obj[k] >= 0):
            problems.append(Problem(k, obj[k], "expected an integer in [0, 2^63)"))
    for k, ok in (("commit_offsets_ms", _is_number), ("commit_tokens", _is_int)):
        value = obj.get(k)
        if value is not None and not (isinstance(value, list) and all(ok(v) for v in value)):
            problems.append(
                Problem(k, value, "expected a list of " + ("finite numbers" if ok is _is_number else "integers"))
            )
    return problems


def _vocabulary(obj: dict[str, Any]) -> list[Problem]:
    problems = []
    for k, words in (("finish_reason", FinishReason), ("mode", Mode), ("phase", RECORD_PHASES), ("arm", Arm)):
        if obj.get(k) is not None and obj[k] not in tuple(words):
            problems.append(Problem(k, obj[k], f"expected one of {', '.join(words)}"))
    if obj["schema_version"] != REQUEST_RECORD_VERSION:
        problems.append(
            Problem("schema_version", obj["schema_version"], f"request records are version {REQUEST_RECORD_VERSION}")
        )
    if (obj.get("epoch") is None) != (obj.get("arm") is None):
        problems.append(Problem("arm", obj.get("arm"), "epoch and arm are set together or not at all"))
    return problems


def _timeline(obj: dict[str, Any]) -> list[Problem]:
    offsets, tokens = obj["commit_offsets_ms"], obj["commit_tokens"]
    arrival, first, finish = obj["arrival_ts"], obj.get("first_token_ts"), obj["finish_ts"]
    problems = []
    if finish < arrival:
        problems.append(Problem("finish_ts", finish, f"before arrival_ts {arrival!r}"))
    if len(offsets) != len(tokens):
        problems.append(Problem("commit_tokens", tokens, f"{len(tokens)} entries for {len(offsets)} commit offsets"))
    if any(b < a for a, b in itertools.pairwise(offsets)) or any(o < 0 for o in offsets):
        problems.append(Problem("commit_offsets_ms", offsets, "must be >= 0 and non-decreasing"))
    if any(t < 1 for t in tokens) or sum(tokens) != obj["output_tokens"]:
        problems.append(Problem("commit_tokens", tokens, f"each >= 1, summing to output_tokens {obj['output_tokens']}"))
    if first is None and (offsets or obj["finish_reason"] != FinishReason.CANCELLED):
        problems.append(
            Problem("first_token_ts", None, "missing: only a request cancelled before its first commit has none")
        )
    if first is not None:
        if not arrival <= first <= finish:
            problems.append(Problem("first_token_ts", first, "must lie between arrival_ts and finish_ts"))
        elif not offsets or abs(offsets[0] - (first - arrival) * 1000) > _TTFT_TOLERANCE_MS:
            problems.append(
                Problem("commit_offsets_ms", offsets[:1], "the first offset must be first_token_ts - arrival_ts")
            )
    if offsets and offsets[-1] > (finish - arrival) * 1000 + _TTFT_TOLERANCE_MS:
        problems.append(Problem("commit_offsets_ms", offsets[-1:], "a commit after finish_ts"))
    return problems


def validate(obj: Any) -> list[Problem]:
    """Every problem of one decoded record (an empty list: valid)."""
    if not isinstance(obj, dict):
        return [Problem("record", obj, "expected a JSON object")]
    problems = _types(obj)
    if problems:
        return problems  # the checks below read the fields as the types they must have
    return _vocabulary(obj) + _timeline(obj)


def to_table(records: list[dict[str, Any]]) -> pa.Table:
    """Valid records as stored rows (with ``ttft_ms`` and ``tpot_ms`` computed once, here)."""
    rows = []
    for obj in records:
        record = RequestRecord(**obj)
        rows.append({**obj, "ttft_ms": record.ttft_ms, "tpot_ms": record.tpot_ms})
    return pa.Table.from_pylist(rows, schema=REQUEST_RECORD_SCHEMA)
