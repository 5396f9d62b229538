from __future__ import annotations

import pytest

from collectors.ingest import Ingestor
from collectors.metrics import Metrics
from collectors.store import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "events.duckdb") as s:
        yield s


@pytest.fixture
def ingestor(store):
    return Ingestor(store, Metrics())
