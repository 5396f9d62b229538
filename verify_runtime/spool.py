"""A replica's on-disk spool: records it could not post wait here, in order, until the controller is back.

Each failed post becomes one segment file (``seg-<n>.ndjson``, the very body that failed, written to a
temporary name, fsynced and renamed, and the directory fsynced: a segment is whole or absent, and present
once ``append`` returns). ``replay`` posts the segments oldest first and deletes each only after the
controller acknowledged it; a segment whose answer was lost is posted again, and the controller
quarantines the repeats as duplicates of stored (replica, step_id) keys: nothing acknowledged is lost,
nothing is stored twice. Past ``max_bytes`` the oldest segments are dropped, and every dropped record is
counted (``dropped``), never silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol


class Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def ndjson(records: Sequence[Record]) -> bytes:
    """Records (step or request records) as the NDJSON body their route takes."""
    return b"".join(_line(r) for r in records)


def bodies(records: Sequence[Record], max_bytes: int) -> list[tuple[bytes, Sequence[Record]]]:
    """``records`` as consecutive NDJSON bodies of at most ``max_bytes`` each (a record longer alone is a
    body of its own), each with the records it holds: a backlog posted whole could pass the route's limit
    and be refused at every retry."""
    out: list[tuple[bytes, Sequence[Record]]] = []
    lines: list[bytes] = []
    size = first = 0
    for i, record in enumerate(records):
        line = _line(record)
        if lines and size + len(line) > max_bytes:
            out.append((b"".join(lines), records[first:i]))
            lines, size, first = [], 0, i
        lines.append(line)
        size += len(line)
    if lines:
        out.append((b"".join(lines), records[first:]))
    return out


def _line(record: Record) -> bytes:
    return json.dumps(record.to_dict()).encode() + b"\n"


def left_behind(root: Path, own: Path) -> dict[Path, int]:
    """Spools under ``root`` other than ``own`` that still hold records, and how many each holds. A replica
    named by default (host and process id) spools under a new name after a restart, so what the last run
    could not post waits under its old one until a replica of that name replays it."""
    if not root.is_dir():
        return {}
    held = {d: sum(p.read_bytes().count(b"\n") for p in d.glob("seg-*.ndjson")) for d in root.iterdir() if d.is_dir()}
    return {d: n for d, n in sorted(held.items()) if n and d.resolve() != own.resolve()}


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int = 256 << 20):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes={max_bytes}: must be > 0")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped = 0
        for stale in self.dir.glob("*.tmp"):  # a write the process did not finish: never acknowledged
            stale.unlink()
        self.waiting = sum(p.read_bytes().count(b"\n") for p in self.segments())  # records in the spool

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.ndjson"))

    def append(self, records: Sequence[Record]) -> None:
        """Keep ``records`` for a later ``replay``, dropping (and counting) the oldest past ``max_bytes``."""
        if not records:
            return
        segments = self.segments()
        number = int(segments[-1].stem.removeprefix("seg-")) + 1 if segments else 1
        final = self.dir / f"seg-{number:09d}.ndjson"
        temporary = final.with_suffix(".tmp")
        with open(temporary, "wb") as out:
            out.write(ndjson(records))
            out.flush()
            os.fsync(out.fileno())
        temporary.rename(final)
        _sync_directory(self.dir)  # the rename itself is durable only once its directory is
        self.waiting += len(records)
        self._trim()

    def _trim(self) -> None:
        segments = self.segments()
        total = sum(p.stat().st_size for p in segments)
        while total > self.max_bytes and len(segments) > 1:
            oldest = segments.pop(0)
            total -= oldest.stat().st_size
            lost = oldest.read_bytes().count(b"\n")
            self.dropped += lost
            self.waiting -= lost
            oldest.unlink()

    def replay(self, post: Callable[[bytes], object]) -> int:
        """Post every segment, oldest first, deleting each once ``post`` returned; returns records posted.

        ``post`` raises when the controller is still unreachable: replay stops there, keeping the rest."""
        posted = 0
        for segment in self.segments():
            body = segment.read_bytes()
            post(body)
            segment.unlink()
            posted += body.count(b"\n")
            self.waiting -= body.count(b"\n")
        return posted
