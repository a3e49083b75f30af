"""``offset-ledger policy show|set|history``: a pipeline's restart policies, decided once, audited.

``start_from_ledger(pipeline, topics, checkpoint_root=...)`` applies them; an argument given in code
overrides one for that call and the plan says so (``offset_ledger.rules.policies``).
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar

import typer

from offset_ledger.cli.connections import LedgerOptions
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import OutputOptions, check_format, emit
from offset_ledger.errors import ConfigError, InvalidInput, LedgerWithoutSchema
from offset_ledger.ledger.engine import check_connection, ensure_schema, translate_db_error
from offset_ledger.ledger.policy_store import current_policies, policy_history, set_policies
from offset_ledger.operate.inputs import check_name
from offset_ledger.operate.known import require_pipeline
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.policy_view import API_NAMES, change_dict, policies_document
from offset_ledger.rules.policies import DEFAULTS, POLICY_KEYS, check_policies, merged

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress

T = TypeVar("T")

policy_app = typer.Typer(help="A pipeline's stored restart policies (first run, data loss, windows, mirroring).",
                         no_args_is_help=True)


def _with_ledger(ledger: LedgerAddress, doing: str, work: Callable[[Any], T], *, write: bool = False) -> T:
    """``work(conn)`` on the ledger (a write creates and upgrades it; a read never does), errors translated."""
    from sqlalchemy.exc import SQLAlchemyError

    ops = Operations.open(replace(ledger, create=write))
    engine = ops.engine
    try:
        check_connection(engine)
        if write:
            ensure_schema(engine)
        with (engine.begin() if write else engine.connect()) as conn:
            return work(conn)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, doing) from exc
    finally:
        ops.close()


def _known(conn: Any, pipeline: str, read: Callable[[Any, str], T]) -> T:
    """``read(conn, pipeline)`` of a pipeline the ledger knows (runs, positions or stored policies)."""
    require_pipeline(conn, pipeline, with_policies=True)
    return read(conn, pipeline)


def _rows(policies: dict) -> list[dict]:  # type: ignore[type-arg]
    # The API's names (onDataLoss): one casing for the CLI's JSON/CSV and the API.
    return [{"policy": API_NAMES[k], "value": policies.get(k, DEFAULTS[k]),
             "source": "stored" if k in policies else "default"} for k in POLICY_KEYS]


@policy_app.command("show")
@grouped
def show_cmd(pipeline: str = typer.Argument(..., metavar="PIPELINE"), ledger: LedgerOptions = LedgerOptions(),
             out: OutputOptions = OutputOptions()) -> None:
    """The policies a restart of PIPELINE applies (stored, else the default)."""
    check_name("pipeline", pipeline)
    check_format(out.fmt)

    history = _with_ledger(ledger.address(), "reading policies", lambda conn: _known(conn, pipeline, policy_history))
    policies = dict(history[-1].policies) if history else {}
    # JSON: the API's GET answer, field for field (stored, effective, sources, lastChange).
    emit(_rows(policies), ["policy", "value", "source"], out.fmt, document=policies_document(pipeline, history),
         truncate=out.truncate)


@dataclass(frozen=True)
class PolicyValues:
    """The policies ``policy set`` was given a value for (None: not given, left as stored)."""

    first_run: Annotated[Optional[str], typer.Option(
        "--first-run", metavar="earliest|latest|TS|JSON", help="Where a pipeline the ledger does not know starts.")] = None
    on_data_loss: Annotated[Optional[str], typer.Option(
        "--on-data-loss", metavar="fail|earliest", help="Offsets outside the broker's log.")] = None
    window: Annotated[Optional[str], typer.Option(
        "--window", metavar="DURATION", help="Windowed pipeline: rewind for open windows on every upgrade.")] = None
    slide: Annotated[Optional[str], typer.Option(
        "--slide", metavar="DURATION", help="Sliding windows: the slide.")] = None
    watermark_delay: Annotated[Optional[str], typer.Option(
        "--watermark-delay", metavar="DURATION", help="The query's withWatermark delay.")] = None
    kafka_timestamp: Annotated[Optional[bool], typer.Option(
        "--event-time-is-kafka-timestamp/--event-time-in-payload",
        help="The event time is the Kafka record timestamp.")] = None
    commit_to_kafka: Annotated[Optional[bool], typer.Option(
        "--commit-to-kafka/--no-commit-to-kafka", help="Mirror positions into the Kafka consumer group.")] = None

    def given(self) -> dict[str, Any]:
        """Policy key -> value, for the options given."""
        return {k: v for k, v in {
            "first_run": self.first_run, "on_data_loss": self.on_data_loss, "window": self.window,
            "slide": self.slide, "watermark_delay": self.watermark_delay,
            "event_time_is_kafka_timestamp": self.kafka_timestamp,
            "commit_to_kafka": self.commit_to_kafka}.items() if v is not None}


@policy_app.command("set")
@grouped
def set_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE"),
    values: PolicyValues = PolicyValues(),
    unset: Optional[list[str]] = typer.Option(None, "--unset", metavar="POLICY",
                                              help="Remove a stored policy (back to the default); repeatable."),
    reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="Why (kept in the history)."),
    actor: Optional[str] = typer.Option(None, "--actor", metavar="NAME", help="Who (default: the OS user)."),
    new_pipeline: bool = typer.Option(False, "--new-pipeline",
                                      help="PIPELINE has not run yet: store its policies before its first run."),
    ledger: LedgerOptions = LedgerOptions(),
) -> None:
    """Change PIPELINE's stored policies; every change is kept with who and why.

    A pipeline the ledger does not know is refused (a typo would store policies nobody reads) unless
    --new-pipeline.

    Example: offset-ledger policy set orders --on-data-loss earliest --window 10m --reason "windowed since v2"
    """

    check_name("pipeline", pipeline)
    changes = values.given()

    by_api_name = {v: k for k, v in API_NAMES.items()}
    for key in unset or []:
        name = by_api_name.get(key, key.replace("-", "_"))  # onDataLoss (as shown), on-data-loss or on_data_loss
        if name not in POLICY_KEYS:
            raise InvalidInput(f"--unset {key}: no such policy (known: {', '.join(API_NAMES.values())})")
        if name in changes:
            raise InvalidInput(f"--unset {key} and a value for it in one call")
        changes[name] = None
    if not changes:
        raise InvalidInput("nothing to set: give a policy option or --unset POLICY")
    if not (reason and reason.strip()):
        raise InvalidInput('a policy change needs a reason (--reason TEXT); it is kept in the history')
    check_policies(changes)  # bad values fail before any connection is made
    read = current_policies if new_pipeline else (lambda conn, name: _known(conn, name, current_policies))
    where = ledger.address()
    try:  # and a set that is wrong as a whole (a slide with no window) before anything is created
        current = _with_ledger(where, "reading policies", lambda conn: read(conn, pipeline))
    except (ConfigError, LedgerWithoutSchema):  # no ledger (schema) yet: only a new pipeline's call creates it
        if not new_pipeline:
            raise
        current = {}
    merged(current, changes)
    change = _with_ledger(where, "storing policies", lambda conn: set_policies(
        conn, pipeline, changes, actor=actor or getpass.getuser() or "cli", reason=reason), write=True)
    emit(_rows(dict(change.policies)), ["policy", "value", "source"], "table")


@policy_app.command("history")
@grouped
def history_cmd(pipeline: str = typer.Argument(..., metavar="PIPELINE"), ledger: LedgerOptions = LedgerOptions(),
                out: OutputOptions = OutputOptions()) -> None:
    """Every change of PIPELINE's policies, newest first: when, who, why, and the policies after it."""
    import json

    check_name("pipeline", pipeline)
    check_format(out.fmt)
    changes = _with_ledger(ledger.address(), "reading policies", lambda conn: _known(conn, pipeline, policy_history))

    # The API's answer (GET .../policies/history), newest first; a row per change, its policies in one cell.
    items = [change_dict(c) for c in reversed(changes)]
    rows = [{**item, "policies": json.dumps(item["policies"], sort_keys=True)} for item in items]
    emit(rows, ["id", "createdAt", "actor", "reason", "policies"], out.fmt, {"pipeline": pipeline, "changes": items},
         truncate=out.truncate)


def register(app: typer.Typer) -> None:
    """Add ``policy`` to the command line."""
    app.add_typer(policy_app, name="policy")
