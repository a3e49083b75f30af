"""The REST API: ``create_app`` builds the FastAPI application ``offset-ledger serve`` runs."""

from __future__ import annotations

from offset_ledger.api.app import create_app

__all__ = ["create_app"]

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "tokens"
})
