"""``Pipeline``: one object for a pipeline's listener and its restart, so the plan cannot be half applied.

A thin layer over :class:`~offset_ledger.capture.listener.OffsetLedgerListener` and the restart
(``operate.restart.restart_at``, what ``start_from_ledger`` calls too, with the same
``RestartRequest``): the pipeline's name, ledger, topics, Kafka settings
and application version are given once; :meth:`Pipeline.start` plans the restart and configures the
Kafka reader with everything the plan says (the subscription the plan was made for, the bootstrap
servers and Kafka options, ``startingOffsets``), and hands back the checkpoint location to write with.
Nothing here changes what the listener records or what a restart decides; importing this module
does not import PySpark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.operate.inputs import check_name
from offset_ledger.operate import restart
from offset_ledger.rules.policies import POLICY_KEYS, Policies
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.restart_request import RestartRequest

if TYPE_CHECKING:
    from offset_ledger.capture.listener import OffsetLedgerListener
    from offset_ledger.rules.plan import RestartPlan

#: What the pipeline holds of a restart (``start_from_ledger``'s names; ``name`` is ``pipeline``): given
#: once, to the listener and to every restart.
HELD = frozenset({"pipeline", "topics", "topic_pattern", "dsn", "bootstrap_servers", "kafka_options",
                  "consumer_group", "app_version"})
#: The restart's switches a call of :meth:`Pipeline.plan` / :meth:`Pipeline.start` may give beside
#: ``checkpoint_root`` and the policies (``POLICY_KEYS``, which override the stored ones for that call).
SWITCHES = frozenset({"new_checkpoint", "allow_first_run", "adopt_checkpoint", "sinks"})


def call_arguments() -> frozenset[str]:
    """What a call of :meth:`Pipeline.plan` / :meth:`Pipeline.start` may give: ``checkpoint_root``, the
    policies and the switches (``tests/unit/operate/test_pipeline_surface.py`` holds them, with ``HELD``,
    to ``start_from_ledger``'s signature)."""
    return frozenset({"checkpoint_root", *POLICY_KEYS, *SWITCHES})


def check_overrides(overrides: Mapping[str, Any], what: str) -> None:
    """TypeError naming an argument ``plan``/``start`` does not take (a typo must not be ignored)."""
    allowed = call_arguments()
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        held = sorted(set(unknown) & HELD)
        why = f" ({', '.join(held)} belong(s) to the Pipeline)" if held else ""
        raise TypeError(f"{what}() got unexpected keyword argument(s) {', '.join(unknown)}{why}; "
                        f"it takes {', '.join(sorted(allowed))}")


def spark_kafka_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Kafka client settings as Spark's reader takes them: every key ``kafka.``-prefixed, values as text."""
    out: dict[str, str] = {}
    for key, value in (options or {}).items():
        name = key if key.startswith("kafka.") else f"kafka.{key}"
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


@dataclass(frozen=True)
class PipelineStart:
    """What :meth:`Pipeline.start` hands back: the plan, applied.

    ``reader`` is the ``DataStreamReader`` with the subscription, the Kafka settings and
    ``startingOffsets`` set; ``checkpoint_location`` is the checkpoint the query must write with
    (the plan's: the current generation, or a fresh one). :meth:`load` and :meth:`write_stream`
    use both, so neither can be forgotten.
    """

    plan: RestartPlan
    reader: Any
    checkpoint_location: str

    @property
    def starting_offsets_json(self) -> str:
        return self.plan.starting_offsets_json

    def load(self) -> Any:
        """The streaming DataFrame: ``reader.load()``."""
        return self.reader.load()

    def write_stream(self, df: Any) -> Any:
        """``df.writeStream`` with ``checkpointLocation`` set to the plan's checkpoint."""
        return df.writeStream.option("checkpointLocation", self.checkpoint_location)


@dataclass(frozen=True)
class Pipeline:
    """A pipeline recorded in the ledger: its listener and its restart from one set of arguments.

    ``topics`` (a list, like ``subscribe``) or ``topic_pattern`` (a regex, like ``subscribePattern``);
    ``bootstrap_servers`` (default ``kafka.bootstrap.servers`` in ``kafka_options``, then
    ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``) and Spark-style ``kafka_options`` reach the cluster, for the
    restart and for the reader :meth:`start` configures. ``dsn`` (default ``OFFSET_LEDGER_DSN``, then
    the embedded SQLite ledger), ``consumer_group`` and ``app_version`` are passed to both the
    listener and the restart. The restart policies stored with the pipeline
    (``offset-ledger policy set``, ``PUT /api/v1/pipelines/{pipeline}/policies``) apply to every
    start; a keyword given to :meth:`plan` or :meth:`start` overrides one for that call.
    """

    name: str
    topics: Sequence[str] | None = None
    _: KW_ONLY
    topic_pattern: str | None = None
    dsn: str | None = None
    bootstrap_servers: str | None = None
    kafka_options: Mapping[str, Any] | None = None
    consumer_group: str | None = None
    app_version: str | None = None
    _options: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name("pipeline", self.name)
        if self.consumer_group is not None:
            check_name("consumer group", self.consumer_group)
        if isinstance(self.topics, str):
            # "orders" would otherwise be five one-letter topics.
            object.__setattr__(self, "topics", [self.topics])
        if (self.topics is None) == (self.topic_pattern is None):
            raise ValueError("give topics (a list, like subscribe) or topic_pattern (like subscribePattern), "
                             "exactly one")
        if self.topics is not None:
            topics = list(self.topics)
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ValueError("topics must be a non-empty list of topic names")
            object.__setattr__(self, "topics", tuple(topics))
        object.__setattr__(self, "_options", dict(self.kafka_options or {}))

    # -- recording

    def listener(self, **kwargs: Any) -> OffsetLedgerListener:
        """An ``OffsetLedgerListener`` recording this pipeline (register it with ``spark.streams.addListener``).

        Every query of the session is recorded as this pipeline. ``kwargs`` are the listener's other
        arguments (``spool_dir``, ``queue_size``, ``commit_to_kafka``, ...), passed as they are.
        """
        from offset_ledger.capture.listener import OffsetLedgerListener

        taken = {"dsn", "pipeline", "consumer_group", "app_version"} & set(kwargs)
        if taken:
            raise TypeError(f"listener(): {', '.join(sorted(taken))} belong(s) to the Pipeline, not to one listener")
        if kwargs.get("commit_to_kafka"):
            kwargs.setdefault("bootstrap_servers", self.bootstrap_servers)
            kwargs.setdefault("kafka_options", self._options or None)
        return OffsetLedgerListener(dsn=self.dsn, pipeline=self.name, consumer_group=self.consumer_group,
                                    app_version=self.app_version, **kwargs)

    # -- restarting

    def plan(self, *, checkpoint_root: str, **overrides: Any) -> RestartPlan:
        """``start_from_ledger`` for this pipeline: the ``RestartPlan`` (a fresh generation is recorded
        when one is needed, exactly as ``start_from_ledger`` does).

        ``overrides``: any ``start_from_ledger`` argument the pipeline does not hold (``call_arguments``):
        the policies for this call, ``new_checkpoint``, ``sinks=[sink]``, ...
        """
        check_overrides(overrides, "plan")
        return self._restart(checkpoint_root, overrides, self.kafka_address())

    def kafka_address(self) -> KafkaAddress:
        """Where the pipeline's cluster is: ``bootstrap_servers``, else ``kafka.bootstrap.servers`` in
        ``kafka_options``, else ``OFFSET_LEDGER_BOOTSTRAP_SERVERS`` (``KafkaAddress.resolve``)."""
        return KafkaAddress.resolve(self.bootstrap_servers, self._options)

    def request(self, checkpoint_root: str, overrides: Mapping[str, Any]) -> RestartRequest:
        """The ``RestartRequest`` this pipeline makes with a call's ``overrides`` (checked: ``check_overrides``)."""
        return RestartRequest(
            PipelineRef(self.name, self.consumer_group),
            RestartOptions(topics=self.topics, topic_pattern=self.topic_pattern,  # type: ignore[arg-type]
                           checkpoint_root=restart.absolute_root(checkpoint_root), app_version=self.app_version,
                           new_checkpoint=bool(overrides.get("new_checkpoint", False)),
                           allow_first_run=bool(overrides.get("allow_first_run", False)),
                           adopt_checkpoint=overrides.get("adopt_checkpoint")),
            Policies(**{k: overrides[k] for k in POLICY_KEYS if k in overrides}),
            sinks=restart.sink_names(overrides.get("sinks") or ()))

    def _restart(self, checkpoint_root: str, overrides: Mapping[str, Any], kafka: KafkaAddress) -> RestartPlan:
        request = self.request(checkpoint_root, overrides)
        return restart.restart_at(LedgerAddress.resolve(self.dsn), kafka, request, tuple(overrides.get("sinks") or ()))

    def reader_options(self, plan: RestartPlan, kafka: KafkaAddress | None = None) -> dict[str, str]:
        """Every option :meth:`start` sets on the reader for ``plan``: Kafka settings, subscription, startingOffsets."""
        options = spark_kafka_options(self._options)
        servers = (kafka or self.kafka_address()).bootstrap_servers
        if servers:
            options["kafka.bootstrap.servers"] = servers
        if self.topics is not None:
            options["subscribe"] = ",".join(self.topics)
        else:
            options["subscribePattern"] = str(self.topic_pattern)
        options["startingOffsets"] = plan.starting_offsets_json
        return options

    def start(self, source: Any, *, checkpoint_root: str, **overrides: Any) -> PipelineStart:
        """Plan the restart and apply it: a ``PipelineStart`` with the configured reader and the checkpoint.

        ``source`` is a ``SparkSession`` or a ``DataStreamReader`` (``spark.readStream``, with any
        reader options of your own such as ``maxOffsetsPerTrigger``). Its format becomes ``kafka``; the
        subscription, the bootstrap servers and Kafka options, and ``startingOffsets`` are set from
        this pipeline and the plan, replacing any set before. Then::

            started = orders.start(spark, checkpoint_root="/checkpoints/orders")
            query = started.write_stream(started.load().selectExpr(...)).format(...).start()

        When the plan resumes the current checkpoint generation, Spark continues from that
        checkpoint and ignores ``startingOffsets`` (``started.plan.fresh_checkpoint`` is False).
        """
        check_overrides(overrides, "start")
        reader = source.readStream if hasattr(source, "readStream") else source
        if not hasattr(reader, "option") or not hasattr(reader, "load"):
            raise TypeError(f"start() needs a SparkSession or a DataStreamReader, not {type(source).__name__}")
        kafka = self.kafka_address()  # resolved once: the restart and the reader reach the same cluster
        plan = self._restart(checkpoint_root, overrides, kafka)
        assert plan.checkpoint_location is not None  # a restart always hands one out
        reader = reader.format("kafka")
        for key, value in self.reader_options(plan, kafka).items():
            reader = reader.option(key, value)
        return PipelineStart(plan=plan, reader=reader, checkpoint_location=plan.checkpoint_location)
