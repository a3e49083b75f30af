"""Fixtures shared by every test; the real-stack ones live in tests/integration/conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def progress_json() -> dict:
    """A real StreamingQueryProgress JSON captured from Spark reading Kafka (see tests/fixtures)."""
    return json.loads((FIXTURES / "progress_kafka.json").read_text())
