"""JSON as sparkgate reads what others write: a key given twice in one object is an error.

The standard decoder keeps the last of two equal keys without a word, so a step record with two
``"accepted"`` fields, or a cost table with two ``"coefficients"``, would be stored as its second while a
reader of the line sees the first. Every JSON body, record line and file a replica, an engine or an
operator writes is decoded through ``loads``; JSON sparkgate wrote itself (its ledger's columns) is not.
"""

from __future__ import annotations

import json
from typing import Any


class RepeatedKeyError(json.JSONDecodeError):
    """An object that gives one key twice. A ``JSONDecodeError``, so every caller that names invalid JSON
    names this too (FastAPI answers it with its 422 for a body that is not JSON)."""

    def __init__(self, key: str, doc: str | bytes | bytearray):
        text = doc if isinstance(doc, str) else bytes(doc).decode("utf-8", errors="replace")
        super().__init__(f"key {key!r} appears more than once in one object", text, 0)
        self.key = key
        # The position is unknown (the hook sees no offsets): the message alone says what is wrong.
        self.args = (self.msg,)

    def __str__(self) -> str:
        return self.msg


class _Repeated(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Repeated(key)
            seen.add(key)
    return obj


def loads(doc: str | bytes | bytearray) -> Any:
    """``json.loads`` of ``doc``, or ``RepeatedKeyError`` naming the first key an object repeats."""
    try:
        return json.loads(doc, object_pairs_hook=_unique)
    except _Repeated as exc:
        raise RepeatedKeyError(exc.key, doc) from None
