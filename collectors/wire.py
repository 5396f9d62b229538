"""Wire formats to Arrow: step records as Python objects, NDJSON and Arrow IPC.

Every front end turns its input into a ``Parsed``: a table in ``WIRE_SCHEMA``
(one row per step, request rows nested) plus the records that could not even be
typed (not an object, a string where an integer belongs, broken JSON), each with
its problems and its original bytes for the quarantine. Nothing here raises on
bad input: a record is either a row of ``wire`` or a ``Rejected``.

The fast paths convert a whole body at once in Arrow's C++ readers; only when
that fails does a per-record pass find which records are at fault and why.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from sparkgate.collectors.schema import (
    REQUEST_TYPE,
    STEP_SCHEMA,
    WIRE_SCHEMA,
    Problem,
    StepRecord,
)
from sparkgate.policies import json_text

# Larger than any sane body, so one block parses it (a line straddling blocks fails).
_JSON_BLOCK = 1 << 26
# Arrow converts 4.5 to an int64 column as 4, silently. A non-integral number in an integer field must be
# rejected instead: the NDJSON fast path reads integer fields as float64 (exact up to 2^53), checks them and
# casts, falling back to the per-line pass (which names the field) when one is not an exact integer; the object
# path checks field by field.
_STEP_INTS = tuple(f.name for f in STEP_SCHEMA if pa.types.is_integer(f.type))
_ROW_INTS = tuple(f.name for f in REQUEST_TYPE if pa.types.is_integer(f.type))
_ROW_INT_LISTS = tuple(
    f.name for f in REQUEST_TYPE if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)
)
_EXACT = float(2**53)
# Arrow reads `true` into a float64 field as 1.0, silently, on both paths; a boolean must be rejected there. The
# only boolean field is the step's ``graph_hit``, so a body whose `true`/`false` bytes outnumber its typed
# ``graph_hit`` values holds a boolean elsewhere (a literal inside a string only sends it to the per-line pass).
_STEP_FLOATS = tuple(f.name for f in STEP_SCHEMA if pa.types.is_floating(f.type))
_ROW_FLOATS = tuple(f.name for f in REQUEST_TYPE if pa.types.is_floating(f.type))
_ROW_FLOAT_LISTS = tuple(
    f.name for f in REQUEST_TYPE if pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type)
)
_BOOLEANS = tuple(f.name for f in WIRE_SCHEMA if pa.types.is_boolean(f.type))


def _as_float(t: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(t):
        return pa.float64()
    if pa.types.is_list(t):
        return pa.list_(_as_float(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _as_float(f.type), f.nullable) for f in t])
    return t


_FLOAT_WIRE = pa.schema([pa.field(f.name, _as_float(f.type)) for f in WIRE_SCHEMA])


def _integer_leaves(array: pa.Array, t: pa.DataType) -> Iterator[pa.Array]:
    """The float64 arrays that stand for integer fields of ``t`` inside ``array`` (read with ``_FLOAT_WIRE``)."""
    if pa.types.is_integer(t):
        yield array
    elif pa.types.is_list(t):
        yield from _integer_leaves(array.flatten(), t.value_type)
    elif pa.types.is_struct(t):
        for i, f in enumerate(t):
            yield from _integer_leaves(array.field(i), f.type)


def _exact_integers(table: pa.Table) -> pa.Table | None:
    """``table`` (read with ``_FLOAT_WIRE``) cast to ``WIRE_SCHEMA``, or None when an integer field holds a
    fraction or a value float64 does not hold exactly."""
    for f in WIRE_SCHEMA:
        for chunk in table.column(f.name).chunks:
            for leaf in _integer_leaves(chunk, f.type):
                ok = pc.and_(pc.equal(leaf, pc.floor(leaf)), pc.less(pc.abs(leaf), _EXACT))
                if pc.any(pc.invert(ok)).as_py():
                    return None
    return table.cast(WIRE_SCHEMA)


@dataclass(frozen=True)
class Rejected:
    """A record that could not be typed. ``position`` is its 0-based index in the input."""

    position: int
    payload: bytes
    problems: list[Problem]


@dataclass
class Parsed:
    """Typed steps plus rejected records. ``positions[i]`` is the input index of ``wire`` row i."""

    wire: pa.Table
    positions: np.ndarray
    rejected: list[Rejected]
    payload: Callable[[int], bytes]  # original bytes of the record at an input index

    @property
    def total(self) -> int:
        return self.wire.num_rows + len(self.rejected)


@dataclass(frozen=True)
class Flat:
    """A batch in columnar form: steps, their request rows, and each row's step index."""

    steps: pa.Table  # STEP_SCHEMA columns, one row per step
    requests: pa.Table  # REQUEST_TYPE columns, one row per request row
    parent: np.ndarray  # int64 step index of each request row
    slot: np.ndarray  # int64 position of each request row within its step


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, default=repr).encode()


def _fraction(value: Any) -> bool:
    return isinstance(value, float) and not (math.isfinite(value) and value.is_integer())


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _number_problems(obj: dict[str, Any]) -> list[Problem]:
    """Values Arrow would silently turn into other numbers, each named: a fraction in an integer field
    (truncated) and a boolean in a float field (read as 0.0 or 1.0)."""
    whole, number = "expected an integer (it would be truncated)", "expected a number, not a boolean"
    problems = [Problem(n, obj[n], whole) for n in _STEP_INTS if _fraction(obj.get(n))]
    problems += [Problem(n, obj[n], number) for n in _STEP_FLOATS if _boolean(obj.get(n))]
    rows = obj.get("requests")
    for slot, row in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(row, dict):
            continue
        for names, wrong, want in ((_ROW_INTS, _fraction, whole), (_ROW_FLOATS, _boolean, number)):
            problems += [Problem(f"requests[{slot}].{n}", row[n], want) for n in names if wrong(row.get(n))]
        for names, wrong, want in ((_ROW_INT_LISTS, _fraction, whole), (_ROW_FLOAT_LISTS, _boolean, number)):
            for n in names:
                values = row.get(n)
                for i, v in enumerate(values if isinstance(values, list) else []):
                    if wrong(v):
                        problems.append(Problem(f"requests[{slot}].{n}[{i}]", v, want))
    return problems


_STEP_FIELDS = frozenset(WIRE_SCHEMA.names)
_ROW_FIELDS = frozenset(f.name for f in REQUEST_TYPE)


def _unknown_fields(obj: dict[str, Any]) -> list[Problem]:
    """Fields the schema lacks, each named: a misspelt field's value would otherwise be lost unnoticed."""
    problems = [Problem(k, v, "unknown field") for k, v in obj.items() if k not in _STEP_FIELDS]
    rows = obj.get("requests")
    for slot, row in enumerate(rows if isinstance(rows, list) else []):
        if isinstance(row, dict):
            problems += [
                Problem(f"requests[{slot}].{k}", v, "unknown field") for k, v in row.items() if k not in _ROW_FIELDS
            ]
    return problems


def _field_problems(obj: Any) -> list[Problem]:
    """Why ``obj`` does not fit ``WIRE_SCHEMA``, field by field (the slow path only)."""
    if not isinstance(obj, dict):
        return [Problem("<record>", type(obj).__name__, "a step record must be a JSON object")]
    problems = _number_problems(obj) + _unknown_fields(obj)
    for f in STEP_SCHEMA:
        try:
            pa.array([obj.get(f.name)], f.type)
        except Exception as exc:
            problems.append(Problem(f.name, obj.get(f.name), f"not a {f.type}: {exc}"))
    rows = obj.get("requests")
    if rows is not None and not isinstance(rows, list):
        return problems + [Problem("requests", type(rows).__name__, "must be a list of request rows")]
    for slot, row in enumerate(rows or []):
        if not isinstance(row, dict):
            problems.append(Problem(f"requests[{slot}]", type(row).__name__, "a request row must be an object"))
            continue
        for f in REQUEST_TYPE:
            try:
                pa.array([row.get(f.name)], f.type)
            except Exception as exc:
                problems.append(Problem(f"requests[{slot}].{f.name}", row.get(f.name), f"not a {f.type}: {exc}"))
    return problems


def _objects(
    objs: Sequence[Any],
    payload: Callable[[int], bytes],
    positions: Sequence[int] | None = None,
    check_values: bool = True,
) -> Parsed:
    """Type ``objs`` (dicts in wire form); ``positions`` maps them to input indices. ``check_values`` False
    skips the search for numbers Arrow would change and for unknown fields (typed records, whose fields are
    the schema's, as their types)."""
    index = np.arange(len(objs)) if positions is None else np.asarray(positions, dtype=np.int64)
    clean = not check_values or not any(
        isinstance(o, dict) and (_number_problems(o) or _unknown_fields(o)) for o in objs
    )
    try:
        if clean:
            return Parsed(pa.Table.from_pylist(list(objs), schema=WIRE_SCHEMA), index, [], payload)
    except Exception:
        pass
    good, kept, rejected = [], [], []
    for i, obj in enumerate(objs):
        problems = _field_problems(obj)
        if not problems:
            try:
                pa.Table.from_pylist([obj], schema=WIRE_SCHEMA)
            except Exception as exc:
                problems = [Problem("<record>", None, f"does not fit the v1 wire schema: {exc}")]
        if problems:
            rejected.append(Rejected(int(index[i]), payload(int(index[i])), problems))
        else:
            good.append(obj)
            kept.append(index[i])
    wire = pa.Table.from_pylist(good, schema=WIRE_SCHEMA)
    return Parsed(wire, np.asarray(kept, dtype=np.int64), rejected, payload)


def reject(parsed: Parsed, problems: dict[int, list[Problem]]) -> Parsed:
    """``parsed`` with the typed records at the given input positions moved to ``rejected``, for a reason
    only their source knows (e.g. synthetic acceptance): they are quarantined whole, like any other."""
    if not problems:
        return parsed
    drop = np.isin(parsed.positions, np.fromiter(problems, dtype=np.int64))
    moved = [Rejected(int(p), parsed.payload(int(p)), problems[int(p)]) for p in parsed.positions[drop]]
    keep = np.flatnonzero(~drop)
    rejected = sorted([*parsed.rejected, *moved], key=lambda r: r.position)
    return Parsed(parsed.wire.take(keep), parsed.positions[keep], rejected, parsed.payload)


def from_dicts(objs: Sequence[Any]) -> Parsed:
    """Type step records given as wire-form objects (``StepRecord.to_dict()`` or parsed JSON)."""
    return _objects(objs, lambda i: _json_bytes(objs[i]))


def from_records(records: Sequence[StepRecord]) -> Parsed:
    """Type in-process ``StepRecord`` objects (typed: their integer fields are ints)."""
    objs = [r.to_dict() for r in records]
    return _objects(objs, lambda i: _json_bytes(objs[i]), check_values=False)


def from_ndjson(data: bytes) -> Parsed:
    """Type an NDJSON body: one step record per non-blank line; positions count those lines."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        # Arrow's JSON reader crashes the process (SIGSEGV, pyarrow 26) on a line whose
        # top-level value is not an object, e.g. `null`; only all-object bodies take the fast path.
        if not all(line.lstrip().startswith(b"{") for line in lines):
            raise ValueError("a line is not a JSON object")
        if not data.isascii():
            # Arrow's reader does not check UTF-8, and a bad byte in an id would fail far later, at every
            # retry; decoding raises here instead (a ValueError), so the per-line pass rejects that line.
            data.decode("utf-8")
        read = pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(block_size=max(_JSON_BLOCK, len(data) + 1)),
            # A field the schema lacks (a misspelt "contrat") fails the fast path; the per-line pass names it.
            parse_options=pajson.ParseOptions(explicit_schema=_FLOAT_WIRE, unexpected_field_behavior="error"),
        )
        wire = _exact_integers(read.select(WIRE_SCHEMA.names))
        if wire is not None and wire.num_rows == len(lines) and _booleans_typed(wire, data):
            return Parsed(wire.select(WIRE_SCHEMA.names), np.arange(len(lines)), [], lines.__getitem__)
    except (pa.ArrowException, ValueError):
        pass  # the per-line pass below tells which lines are at fault
    objs, kept, rejected = [], [], []
    for i, line in enumerate(lines):
        try:
            objs.append(json_text.loads(line))
            kept.append(i)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json.loads goes
            rejected.append(
                Rejected(i, line, [Problem("<line>", line[:80].decode(errors="replace"), f"invalid JSON: {exc}")])
            )
    parsed = _objects(objs, lines.__getitem__, kept)
    parsed.rejected.extend(rejected)
    return parsed


def _booleans_typed(wire: pa.Table, data: bytes) -> bool:
    """Whether every `true`/`false` literal of the body is one of its boolean fields (see ``_BOOLEANS``).
    Each typed boolean is a literal, so the body's count exceeds theirs as soon as one line holds another."""
    typed = sum(len(wire) - wire.column(n).null_count for n in _BOOLEANS)
    return data.count(b"true") + data.count(b"false") <= typed


def _same_kind(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether a column of ``got`` holds ``want``'s values as they are: a wider or narrower integer, a float
    or an integer for a float, a dictionary of them, nulls; not a string for a number, nor a number for a
    flag or a string, which a cast would turn into other values without a word (``"10"`` into 10)."""
    if pa.types.is_null(got) or got == want:
        return True
    if pa.types.is_dictionary(got):
        return _same_kind(got.value_type, want)
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_integer(got) or pa.types.is_floating(got)
    if pa.types.is_string(want):
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    if pa.types.is_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _same_kind(got.value_type, want.value_type)
    if pa.types.is_struct(want):
        if not pa.types.is_struct(got):
            return False
        fields = {f.name: f.type for f in got}
        return set(fields) <= set(want.names) and all(_same_kind(t, want.field(n).type) for n, t in fields.items())
    return False


def from_ipc(data: bytes) -> Parsed:
    """Type an Arrow IPC stream whose rows are step records (columns by wire name).

    Missing columns become nulls, so validation names every missing required field;
    a body that is not an IPC stream, that has a column the schema lacks, or whose columns hold another
    kind of value than the schema's (``_same_kind``) is rejected whole, naming the column.
    """
    try:
        table = pa.ipc.open_stream(data).read_all()
        table.validate(full=True)  # checks UTF-8 too, which a later read of an id would otherwise trip on
    except (pa.ArrowException, ValueError) as exc:
        return _whole_body_rejected(data, Problem("<body>", None, f"not an Arrow IPC stream: {exc}"))
    unknown = [name for name in table.column_names if name not in _STEP_FIELDS]
    if unknown:
        return _whole_body_rejected(data, Problem(unknown[0], None, "unknown column"))
    columns = []
    for f in WIRE_SCHEMA:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        got = table.schema.field(f.name).type
        if not _same_kind(got, f.type):
            return _whole_body_rejected(data, Problem(f.name, str(got), f"expected {f.type}, not {got}"))
        try:
            columns.append(table.column(f.name).cast(f.type))
        except (pa.ArrowException, ValueError) as exc:
            problem = Problem(f.name, str(table.schema.field(f.name).type), f"cannot be read as {f.type}: {exc}")
            return _whole_body_rejected(data, problem)
    return from_wire(pa.Table.from_arrays(columns, schema=WIRE_SCHEMA))


def from_wire(wire: pa.Table) -> Parsed:
    """A table already in ``WIRE_SCHEMA`` as a batch: every row kept for validation; a row's
    payload (wanted only if it is quarantined) is its JSON."""
    return Parsed(wire, np.arange(wire.num_rows), [], lambda i: _json_bytes(wire.slice(i, 1).to_pylist()[0]))


def _whole_body_rejected(data: bytes, problem: Problem) -> Parsed:
    return Parsed(WIRE_SCHEMA.empty_table(), np.zeros(0, np.int64), [Rejected(0, data, [problem])], lambda i: data)


def to_ipc(wire: pa.Table) -> bytes:
    """Serialise a wire table as an Arrow IPC stream (the HTTP body for ``from_ipc``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, wire.schema) as writer:
        writer.write_table(wire)
    return sink.getvalue().to_pybytes()


def flatten(wire: pa.Table) -> Flat:
    """Split a wire table into steps and flat request rows, keeping each row's step and slot."""
    nested = wire.column("requests").combine_chunks()
    rows = pc.list_flatten(nested)
    parent = pc.list_parent_indices(nested).to_numpy().astype(np.int64, copy=False)
    # ``flatten`` (not ``field``) so a null row nulls its fields and they read as missing.
    requests = pa.Table.from_arrays(rows.flatten(), names=[f.name for f in REQUEST_TYPE])
    counts = np.bincount(parent, minlength=wire.num_rows)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    slot = np.arange(len(parent), dtype=np.int64) - starts[parent]
    return Flat(wire.drop_columns(["requests"]), requests, parent, slot)
