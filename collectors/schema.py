"""Event schema v3 (docs/design.md §4): the typed step records shared by producer and consumer.

One ``StepRecord`` per verify step per replica, holding one ``RequestRow`` per
request in the batch. Field names are the wire names (JSON / Arrow).

Invariants a valid record holds (``validate`` enforces them):
- ``0 <= window <= gamma``; ``0 <= accepted <= window``;
- ``full_accept`` is None only when censored (compact, ``accepted == window < gamma``),
  and equals ``accepted`` whenever ``accepted < window``;
- ``confidence`` and ``survival`` have ``gamma`` finite values in [0, 1], survival
  non-increasing with depth;
- ``committed_tokens`` holds ``accepted + 1`` token ids (-1 where a producer,
  e.g. an SGLang server without draft-token logging, does not report the id);
- ``draft_tokens`` (optional) holds the ``gamma`` drafted ids, ``position`` (optional,
  >= 0) the request's sequence length before the step (SGLang's ``prefix_len``), so a
  row's tokens sit at ``position + i``; ``next_accept_prob`` (optional, in [0, 1]) is
  set only on censored rows: the probability the target gives draft ``window + 1``.

Version 2 adds the switchback ``epoch`` and ``arm`` a step was served in (both null
outside switchback) and request records (``collectors.request_records``); version 1
records, which have neither, are still read. The optional request-row fields
``draft_tokens``, ``position`` and ``next_accept_prob`` (censored-label recovery,
``collectors.recovery``) were added to version 2 later: a producer without them sends
them null or leaves them out.

The Arrow schemas below are the columnar forms of the same records: the wire form
(a step with nested request rows) and the stored tables.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkgate.policies.vocabulary import MissReason, Mode, Phase, Status

SCHEMA_VERSION = 3
# The latest unix time a record may carry (2100-01-01): beyond it a value is milliseconds or garbage, and the
# per-bucket sums (``label_sums``) could not index it.
MAX_UNIX_S = 4_102_444_800.0
# The phase a record was served in: a rollout phase, or ``external`` for an engine's own records that no
# sparkgate policy drove (SGLang's observability dump read by ``collect``).
EXTERNAL_PHASE = "external"
RECORD_PHASES = (*Phase, EXTERNAL_PHASE)
READABLE_VERSIONS = (1, 2, 3)
# Ids of either record kind are keys and labels: the same cap as the HTTP API's, and no control or
# bidirectional-format characters.
MAX_ID_CHARS = 512
HIDDEN_CHARS = "[\\x00-\\x1f\\x7f-\\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]"
# Consistency checks one ``POST /v1/consistency`` body may carry; a replica posts more in several.
MAX_CHECKS_PER_REPORT = 10_000
# ``sts_version`` of records whose ``confidence`` was already calibrated where it was produced (an SGLang
# server applies its STS temperatures before it dumps them): refitting STS on them would calibrate twice.
CALIBRATED_AT_SOURCE = "calibrated-at-source"
# ``tier`` of a step whose engine does not report whether it replayed a graph (an SGLang server records the
# padded tier it planned, not a hit or a miss): counted as no miss, and left out of the tier miss rate.
TIER_UNREPORTED = -2
# Wire and storage order of the vocabulary: a mode's or status's code is its index here.
MODES: tuple[Mode, ...] = tuple(Mode)
MISS_REASONS: tuple[MissReason, ...] = tuple(MissReason)


@dataclass(frozen=True)
class Problem:
    """One reason a record is rejected. ``field`` is a path such as ``requests[2].window``."""

    field: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "value": json_safe(self.value), "message": self.message}


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as its text (``nan``, ``inf``), bytes decoded and lone
    surrogates (``"\\ud800"`` in JSON) replaced: JSON has no non-finite numbers, UTF-8 no surrogates, and
    an error reply or quarantine row that echoes the bad value must still serialise and store."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str):
        return unicode_safe(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form: not when JSON's escapes gave it a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NOT_UNICODE = "not valid Unicode (a lone surrogate escape)"


def id_problem(text: str) -> str | None:
    """Why ``text`` cannot be a record's id (``replica_id``, ``request_id``), or None: the rules the
    validators file by field, for a producer to check its own id before it sends a record."""
    if not text:
        return "must not be empty"
    if len(text) > MAX_ID_CHARS:
        return f"at most {MAX_ID_CHARS} characters"
    if not encodable(text):
        return NOT_UNICODE
    if re.search(HIDDEN_CHARS, text):
        return "no control or bidirectional-format characters"
    return None


def unicode_safe(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a valid string is returned as it is)."""
    return text if encodable(text) else text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass
class RequestRow:
    request_id: str
    mode: str
    task: str
    temperature: float
    window_suggested: int | None
    window: int
    accepted: int
    full_accept: int | None
    cap_trim: int
    confidence: list[float]
    survival: list[float]
    committed_tokens: list[int]
    draft_tokens: list[int] | None = None
    position: int | None = None
    next_accept_prob: float | None = None


@dataclass
class StepRecord:
    replica_id: str
    step_id: int
    ts: float
    batch_size: int
    gamma: int
    verify_rows: int
    tier_rows: int
    tier: int
    graph_hit: bool
    miss_reason: str | None
    draft_ms: float
    schedule_ms: float
    verify_ms: float
    accept_ms: float
    step_ms: float
    predicted_step_ms: float | None
    host_syncs: int
    phase: str
    policy_revision: int
    model_version: str
    drafter_version: str
    sts_version: str | None
    cost_table_version: str | None
    requests: list[RequestRow] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    # The joint contract's fingerprint (``policies.contract``); None from producers that predate it.
    contract: str | None = None
    # The switchback epoch and arm (``policies.switchback``) the step was served in; None outside switchback.
    epoch: int | None = None
    arm: str | None = None
    # CPU time the producing process spent on the step (all its threads); None where not measured. On a
    # shared CPU it is the step's cost without the neighbours' share of the cores in it.
    step_cpu_ms: float | None = None
    # The served cost table's prediction for this step at the rows it verified (version 3). Not
    # ``predicted_step_ms``, the scheduler's price of its plan: cap-accept and shadow rows verify the whole
    # block, so a step can run more rows than were priced. None where no cost table is served.
    table_step_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The wire form: one JSON object with ``requests`` as a list of objects."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of ``to_dict``; raises ``KeyError``/``TypeError`` on a malformed object.

        It does not validate values: ``collectors.validate`` does, returning every
        problem instead of stopping at the first.
        """
        body = {k: v for k, v in data.items() if k in _STEP_NAMES}
        body["requests"] = [
            RequestRow(**{k: v for k, v in row.items() if k in _REQUEST_NAMES}) for row in data.get("requests", [])
        ]
        return cls(**body)


_STEP_NAMES = frozenset(f.name for f in dataclasses.fields(StepRecord))
_REQUEST_NAMES = frozenset(f.name for f in dataclasses.fields(RequestRow))

# Depth-label statuses (docs/design.md §2), in the order of their integer codes.
STATUSES: tuple[Status, ...] = tuple(Status)

REQUEST_TYPE = pa.struct(
    [
        pa.field("request_id", pa.string()),
        pa.field("mode", pa.string()),
        pa.field("task", pa.string()),
        pa.field("temperature", pa.float64()),
        pa.field("window_suggested", pa.int64()),
        pa.field("window", pa.int64()),
        pa.field("accepted", pa.int64()),
        pa.field("full_accept", pa.int64()),
        pa.field("cap_trim", pa.int64()),
        pa.field("confidence", pa.list_(pa.float64())),
        pa.field("survival", pa.list_(pa.float64())),
        pa.field("committed_tokens", pa.list_(pa.int64())),
        pa.field("draft_tokens", pa.list_(pa.int64())),
        pa.field("position", pa.int64()),
        pa.field("next_accept_prob", pa.float64()),
    ]
)

STEP_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int64()),
        pa.field("replica_id", pa.string()),
        pa.field("step_id", pa.int64()),
        pa.field("ts", pa.float64()),
        pa.field("batch_size", pa.int64()),
        pa.field("gamma", pa.int64()),
        pa.field("verify_rows", pa.int64()),
        pa.field("tier_rows", pa.int64()),
        pa.field("tier", pa.int64()),
        pa.field("graph_hit", pa.bool_()),
        pa.field("miss_reason", pa.string()),
        pa.field("draft_ms", pa.float64()),
        pa.field("schedule_ms", pa.float64()),
        pa.field("verify_ms", pa.float64()),
        pa.field("accept_ms", pa.float64()),
        pa.field("step_ms", pa.float64()),
        pa.field("predicted_step_ms", pa.float64()),
        pa.field("host_syncs", pa.int64()),
        pa.field("phase", pa.string()),
        pa.field("policy_revision", pa.int64()),
        pa.field("model_version", pa.string()),
        pa.field("drafter_version", pa.string()),
        pa.field("sts_version", pa.string()),
        pa.field("cost_table_version", pa.string()),
        pa.field("contract", pa.string()),
        pa.field("epoch", pa.int64()),
        pa.field("arm", pa.string()),
        pa.field("step_cpu_ms", pa.float64()),
        pa.field("table_step_ms", pa.float64()),
    ]
)

# The wire form (NDJSON line or Arrow IPC row): a step with its request rows nested.
WIRE_SCHEMA = STEP_SCHEMA.append(pa.field("requests", pa.list_(REQUEST_TYPE)))

# Stored request rows: the request struct flattened, keyed by step and position.
REQUEST_SCHEMA = pa.schema(
    [
        pa.field("replica_id", pa.string()),
        pa.field("step_id", pa.int64()),
        pa.field("ts", pa.float64()),
        pa.field("slot", pa.int32()),
    ]
    + list(REQUEST_TYPE)
)

# One row per (request, depth), 1 <= depth <= gamma. ``label`` is y_k, null when censored or estimated;
# ``probability`` is an estimated label's P(y_k = 1), null otherwise.
LABEL_SCHEMA = pa.schema(
    [
        pa.field("replica_id", pa.dictionary(pa.int32(), pa.string())),
        pa.field("step_id", pa.int64()),
        pa.field("ts", pa.float64()),
        pa.field("request_id", pa.dictionary(pa.int32(), pa.string())),
        pa.field("mode", pa.dictionary(pa.int32(), pa.string())),
        pa.field("depth", pa.int16()),
        pa.field("status", pa.dictionary(pa.int32(), pa.string())),
        pa.field("confidence", pa.float64()),
        pa.field("survival", pa.float64()),
        pa.field("label", pa.bool_()),
        pa.field("probability", pa.float64()),
    ]
)

# Fields that may be null on the wire; every other field is required.
NULLABLE_STEP_FIELDS = frozenset(
    {
        "miss_reason",
        "predicted_step_ms",
        "sts_version",
        "cost_table_version",
        "contract",
        "epoch",
        "arm",
        "step_cpu_ms",
        "table_step_ms",
    }
)
NULLABLE_REQUEST_FIELDS = frozenset({"window_suggested", "full_accept", "draft_tokens", "position", "next_accept_prob"})
