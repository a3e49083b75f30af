"""Transactional ``foreachBatch`` sinks: a batch's output and its ledger record commit as one fact.

May import ``capture``, ``ledger``, ``rules`` and the top-level ``errors``/``config``; never the
verbs (``operate``) or a face. ``docs/sinks.md`` states the guarantee and its limits.
"""

from __future__ import annotations

from offset_ledger.sinks.postgres import PostgresSink

__all__ = ["PostgresSink"]
