"""``Sink``: what every transactional sink offers, and all a restart asks of one.

``PostgresSink``, ``DeltaSink``, ``IcebergSink`` and ``KafkaSink`` implement it
(``tests/unit/sinks/test_sink_protocol.py`` checks each): ``foreachBatch`` calls the sink (``__call__`` -> ``write``), ``bind`` puts it on the
checkpoint a plan handed out, ``spec`` names it in the ledger, and ``start_from_ledger(sinks=[...])``
calls ``reconcile`` before it plans. A new sink implements these five and needs nothing else of
the restart. Structural (``typing.Protocol``): a sink need not inherit from anything, so the
executors' pickled copy carries no base class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from offset_ledger.ledger.sink_store import SinkSpec
    from offset_ledger.rules.model import Finding
    from offset_ledger.rules.sink_identity import SinkDecision


@runtime_checkable
class Sink(Protocol):
    """A ``foreachBatch`` sink whose output and ledger record commit as one fact."""

    @property
    def spec(self) -> SinkSpec:
        """The sink as the ledger knows it: name, pipeline, consumer group, kind, target."""
        ...

    def bind(self, checkpoint_location: str) -> Sink:
        """A copy of the sink on the query's checkpoint (``plan.checkpoint_location``)."""
        ...

    def write(self, df: Any, batch_id: int) -> SinkDecision:
        """Commit batch ``batch_id`` with its ledger record (or skip a re-run, or refuse a fenced one)."""
        ...

    def __call__(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``'s entry: ``write``."""
        ...

    def reconcile(self, ledger: Engine) -> tuple[Finding, ...]:
        """Record in the ledger what the target committed and the ledger lacks (a restart calls it first)."""
        ...
