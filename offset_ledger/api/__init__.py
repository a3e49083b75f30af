"""The REST API: ``create_app`` builds the FastAPI application ``offset-ledger serve`` runs."""

from __future__ import annotations

from offset_ledger.api.app import create_app

__all__ = ["create_app"]
