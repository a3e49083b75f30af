"""The REST API: ``create_app`` builds the FastAPI application ``offset-ledger serve`` runs."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing a module of this layer (``api.tokens``, which ``offset-ledger db`` uses)
    # imports no FastAPI: the [server] extra is optional.
    if name == "create_app":
        from offset_ledger.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "tokens"
})
