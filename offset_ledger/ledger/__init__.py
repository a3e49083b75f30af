"""Persistence: the ledger schema (``tables``), engines and migrations (``engine``), and the stores."""
