"""``verify``'s ``loss`` stretches: batches that read fewer rows than their ranges span (issue 41).

The recorder stores each such batch as a ``data_loss`` finding (``details.kind`` ``read_shortfall``,
``offset_ledger.rules.read_shortfall``). The ranges still tile, so the sweep sees nothing; here each
shortfall becomes a stretch of kind ``loss`` over the batch's range, carrying the records not read.
What explains it, read from Kafka now:

- a compacted topic (``cleanup.policy`` with ``compact``): compaction removes records under their
  offsets; every offset of such a range may explain a missing row;
- transaction markers and aborted transactions: the range's offsets still in the log that a
  ``read_committed`` consumer does not get (``offset_ledger.kafka.readable_records``), counted
  exactly; they explain that many missing rows, no more.

The rest is UNEXPLAINED: records the job never saw. Without Kafka (none configured, or it did not
answer) nothing can be explained and the stretch says so.

A Kafka source whose rows nobody counted (``details.kind`` ``rows_unknown``: Spark reported no count
for it and a non-Kafka source's rows share the batch total, issue 47) is neither loss nor fine: each
range it spans is an ``unknown`` stretch, never explained, and Kafka is not asked about it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from offset_ledger.errors import KafkaError
from offset_ledger.kafka.retention_reads import topic_retention
from offset_ledger.rules.read_shortfall import ROWS_UNKNOWN
from offset_ledger.rules.verify import BatchRef, PartitionResult, Reason, Stretch

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter

log = logging.getLogger(__name__)

_Range = tuple[str, int, int, int]


def _spanning(details: dict[str, Any]) -> list[_Range]:
    return [(str(t), int(p), int(f), int(u)) for t, p, f, u in details.get("ranges") or ()
            if f is not None and int(u) > int(f)]


@dataclass
class LossCheck:
    """What ``loss_stretches`` found: a stretch per shortfall finding (by id), its notes, whether Kafka answered."""

    stretches: list[tuple[int, Stretch]] = field(default_factory=list)
    notes: dict[tuple[str, int, int], str] = field(default_factory=dict)
    checked: bool = False  # Kafka was asked and answered (else nothing could be explained)


def loss_stretches(shortfalls: Sequence[tuple[int, str, int, dict[str, Any]]],
                   kafka: KafkaAdapter | None) -> LossCheck:
    """One ``loss`` stretch per shortfall finding, a note per stretch key (topic, partition, from)."""
    wanted = sorted({r for _, _, _, d in shortfalls if d.get("kind") != ROWS_UNKNOWN for r in _spanning(d)})
    policies: dict[str, str] = {}
    readings: dict[_Range, Any] = {}
    unanswered = "Kafka not configured: compaction and transaction markers not checked"
    if kafka is not None and wanted:
        try:
            policies = {t: s.cleanup_policy for t, s in topic_retention(kafka, sorted({r[0] for r in wanted})).items()}
            plain = [r for r in wanted if "compact" not in policies.get(r[0], "")]
            readings = kafka.read_ranges(plain)
            unanswered = ""
        except KafkaError as exc:
            log.warning("verify: Kafka did not answer for the read shortfalls: %s", exc)
            unanswered = f"Kafka did not answer ({exc}): compaction and transaction markers not checked"
    out = LossCheck(checked=not unanswered)
    for finding_id, query_id, batch_id, details in shortfalls:
        spans = _spanning(details)
        if not spans:
            continue
        if details.get("kind") == ROWS_UNKNOWN:
            for topic, partition, since, until in spans:
                out.stretches.append((finding_id, Stretch(topic, partition, 0, since, until, "unknown", 1, False, (),
                                                          batches=(BatchRef(query_id, batch_id),))))
                out.notes[(topic, partition, since)] = (
                    f"Spark reported no row count for the source, and the batch total holds another source's "
                    f"rows: whether these {until - since:,} offsets were all read is unknown "
                    f"(data_loss finding {finding_id})")
            continue
        missing = int(details.get("missing") or 0)
        explainable = 0
        reasons: list[Reason] = []
        said: list[str] = [unanswered] if unanswered else []
        compacted = sorted({t for t, _, _, _ in spans if "compact" in policies.get(t, "")})
        for t in compacted:
            reasons.append(Reason("compacted", None, f"{t}: cleanup.policy={policies[t]}"))
        skipped = 0
        for r in spans:
            if r[0] in compacted:
                explainable += r[3] - r[2]
                continue
            reading = readings.get(r)
            if reading is None:
                continue
            if reading.skipped is None:
                said.append(f"{r[0]}-{r[1]} [{r[2]}, {r[3]}) not read again in time")
            else:
                skipped += reading.skipped
            if reading.gone:
                said.append(f"{reading.gone:,} offsets of {r[0]}-{r[1]} [{r[2]}, {r[3]}) are below log-start now")
        if skipped:
            explainable += skipped
            reasons.append(Reason("transaction_markers", None,
                                  f"{skipped:,} offsets a read_committed consumer does not get (markers, aborted)"))
        unexplained = max(0, missing - explainable)
        if unexplained and reasons:
            said.append(f"{missing - unexplained:,} of the {missing:,} missing explained: "
                        + "; ".join(r.label() for r in reasons))
        topic, partition, since, until = spans[0]
        if not details.get("per_partition") and len(spans) > 1:
            said.append("source total over " + ", ".join(f"{t}-{p} [{f}, {u})" for t, p, f, u in spans))
        said.append(f"batch read {int(details.get('rows_read') or 0):,} rows of "
                    f"{int(details.get('offsets_spanned') or 0):,} offsets: data_loss finding {finding_id}")
        stretch = Stretch(topic, partition, 0, since, until, "loss", 1, unexplained == 0,
                          tuple(reasons) if unexplained == 0 else (), batches=(BatchRef(query_id, batch_id),),
                          lost=unexplained or missing)
        out.stretches.append((finding_id, stretch))
        out.notes[(topic, partition, since)] = "; ".join(said)
    return out


def attach(results: list[PartitionResult], stretches: Sequence[Stretch]) -> None:
    """Each loss stretch into the result of its partition and incarnation (a new one when history was pruned)."""
    for s in stretches:
        mine = [r for r in results if (r.topic, r.partition) == (s.topic, s.partition)]
        inside = [r for r in mine if r.first_offset is not None and r.end_offset is not None
                  and r.first_offset <= s.from_offset < r.end_offset]
        home = (inside or mine or [None])[-1]
        if home is None:
            home = PartitionResult(s.topic, s.partition, 0, None, None, None, 0, 0)
            results.append(home)
        s.incarnation = home.incarnation
        home.stretches.append(s)
        home.stretches.sort(key=lambda x: (x.from_offset, x.until_offset))
