"""A deterministic byte corpus built from text every Python install ships.

Two domains: ``code`` (the standard library's ``.py`` sources, tests and
third-party site-packages left out) and ``prose`` (the ``pydoc_data`` help
topics). Each document lands in one split by a stable hash of its domain and
name, so the splits never overlap and never depend on iteration order. The
``content_hash`` pins what a model was trained on: the same Python version
gives the same hash, a different one is visible in the manifest.

Token ids are bytes (0..255); every document starts with ``BOS``.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .model import BOS

DOMAINS = ("code", "prose")
SPLITS = ("train", "validation", "calibration", "test")
# Upper edges of each split on the unit interval a document's hash maps to.
SPLIT_EDGES = (0.80, 0.87, 0.935, 1.0)
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "__pycache__", "idle_test"})


@dataclass(frozen=True)
class Document:
    domain: str
    name: str
    data: bytes


def split_of(domain: str, name: str) -> str:
    """The split a document belongs to: a pure function of its domain and name."""
    digest = hashlib.sha256(f"{domain}/{name}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return next(split for split, edge in zip(SPLITS, SPLIT_EDGES) if u < edge)


def stdlib_documents() -> list[Document]:
    """Every non-empty stdlib ``.py`` file (code) and pydoc topic (prose), sorted by (domain, name)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [
        Document("code", path.relative_to(root).as_posix(), path.read_bytes())
        for path in root.rglob("*.py")
        if not _SKIP_DIRS.intersection(path.relative_to(root).parts) and path.stat().st_size
    ]
    from pydoc_data.topics import topics

    docs += [Document("prose", name, text.encode()) for name, text in topics.items()]
    return sorted(docs, key=lambda d: (d.domain, d.name))


class Corpus:
    """Documents grouped by (split, domain) into one token stream each."""

    def __init__(self, documents: list[Document]):
        unknown = {d.domain for d in documents} - set(DOMAINS)
        if unknown:
            raise ValueError(f"document domain must be one of {DOMAINS}, got {sorted(unknown)}")
        self.documents: dict[tuple[str, str], list[Document]] = {(s, d): [] for s in SPLITS for d in DOMAINS}
        for doc in documents:
            self.documents[(split_of(doc.domain, doc.name), doc.domain)].append(doc)
        self.streams = {key: _stream(docs) for key, docs in self.documents.items()}
        digest = hashlib.sha256()
        for (split, domain), docs in sorted(self.documents.items()):
            for doc in sorted(docs, key=lambda d: d.name):
                digest.update(f"{split}/{domain}/{doc.name}/".encode() + hashlib.sha256(doc.data).digest())
        self.content_hash = digest.hexdigest()[:16]

    def stats(self) -> dict:
        """Documents and bytes per split and domain, plus the content hash."""
        return {
            "content_hash": self.content_hash,
            "splits": {
                split: {
                    domain: {
                        "documents": len(self.documents[(split, domain)]),
                        "bytes": sum(len(d.data) for d in self.documents[(split, domain)]),
                    }
                    for domain in DOMAINS
                }
                for split in SPLITS
            },
        }

    def stream(self, split: str, domain: str) -> torch.Tensor:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if domain not in DOMAINS:
            raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
        return self.streams[(split, domain)]

    def batch(
        self, split: str, size: int, length: int, generator: torch.Generator, prose_fraction: float = 0.2
    ) -> torch.Tensor:
        """``[size, length]`` token windows at random offsets; each row is prose with
        probability ``prose_fraction``, else code. Deterministic given the generator."""
        if not 0.0 <= prose_fraction <= 1.0:
            raise ValueError(f"prose_fraction must be in [0, 1], got {prose_fraction}")
        prose = torch.rand(size, generator=generator) < prose_fraction
        rows = []
        for is_prose in prose.tolist():
            stream = self.stream(split, "prose" if is_prose else "code")
            if len(stream) <= length:
                raise ValueError(f"split {split!r} holds {len(stream)} tokens, fewer than length={length}")
            start = int(torch.randint(len(stream) - length, (1,), generator=generator))
            rows.append(stream[start : start + length])
        return torch.stack(rows).long()

    def prompts(self, split: str, domain: str, count: int, length: int) -> list[list[int]]:
        """``count`` prompts of ``length`` tokens at evenly spaced offsets of the stream."""
        stream = self.stream(split, domain)
        span = len(stream) - length
        if span < count:
            raise ValueError(
                f"split {split!r} domain {domain!r} holds {len(stream)} tokens: "
                f"too few for {count} prompts of length {length}"
            )
        return [stream[i * span // count : i * span // count + length].tolist() for i in range(count)]


def _stream(docs: list[Document]) -> torch.Tensor:
    bos = np.array([BOS], np.int16)
    parts = [bos]
    for doc in docs:
        parts += [np.frombuffer(doc.data, np.uint8).astype(np.int16), bos]
    return torch.from_numpy(np.concatenate(parts))


@functools.lru_cache(maxsize=1)
def stdlib_corpus() -> Corpus:
    return Corpus(stdlib_documents())
