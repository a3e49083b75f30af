"""Settings from arguments and ``OFFSET_LEDGER_*`` environment variables (the only env reader)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any


def default_home() -> Path:
    """Where the embedded SQLite ledger and the listener's spool live unless told otherwise."""
    return Path.home() / ".local" / "share" / "offset-ledger"


if TYPE_CHECKING:
    Settings = Any  # the class settings_class() builds: a pydantic-settings model of the fields below


def settings_class() -> Any:
    """``Settings``, every ``OFFSET_LEDGER_*`` variable as a pydantic-settings model, built on first use.

    The package's one import of pydantic-settings: a command given its DSN never needs it, and every
    module can import this one at its top. ``offset_ledger.config.Settings`` is the same class.
    """
    global _settings_class
    if _settings_class is not None:
        return _settings_class
    from pydantic import Field
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Settings(BaseSettings):
        """Every ``OFFSET_LEDGER_*`` variable; an explicit argument always wins over the environment."""

        model_config = SettingsConfigDict(env_prefix="OFFSET_LEDGER_", extra="ignore")

        # The descriptions are docs/configuration.md's table (``settings_table``; a test keeps them equal).
        dsn: str | None = Field(default=None, description=(
            "listener, `start_from_ledger`, CLI, API: the ledger database (SQLAlchemy URL, e.g. "
            "`postgresql+psycopg2://user:pw@host/db`)"), json_schema_extra={"shown_default": (
                "the embedded SQLite file `$OFFSET_LEDGER_HOME/ledger.db`")})
        home: Path = Field(default_factory=default_home, description=(
            "the embedded ledger and the listener's spool directory (`spool/`)"),
            json_schema_extra={"shown_default": "`~/.local/share/offset-ledger`"})
        bootstrap_servers: str | None = Field(default=None, description=(
            "`start_from_ledger`, `resolve`, `topic`, `lag`, `reset`, `mirror`, `serve`: the Kafka bootstrap servers"),
            json_schema_extra={"shown_default": "none (required where Kafka is asked)"})
        api_token: str | None = Field(default=None, description=(
            "`serve`: a bearer token (an operate token) every endpoint but the probes `/healthz` and `/livez` requires"),
            json_schema_extra={"shown_default": "unset (no auth; loopback bind only)"})
        api_tokens: str | None = Field(default=None, description=(
            "`serve`: named tokens `name:role:secret`, comma-separated (role `read` or `operate`); the audit "
            "trail records the name"))
        api_tokens_file: Path | None = Field(default=None, description=(
            "`serve`: a file of `name:role:secret` lines (same as `OFFSET_LEDGER_API_TOKENS`)"))
        allowed_hosts: str | None = Field(default=None, description=(
            "`serve`: `Host` names the API answers besides loopback and the bound address (comma-separated; `*` for any)"))
        host: str = Field(default="127.0.0.1", description="`serve --host`: the address to bind")
        # Text, checked where it is used: a malformed variable must fail `serve` only, with its name.
        port: str = Field(default="9090", description="`serve --port`: the port to listen on")
        heartbeat_interval: str = Field(default="10s", description=(
            "the listener: how often the driver's heartbeat thread writes that its runs are alive; a run is "
            "active while its last beat is younger than 3 x this, so a SIGKILLed driver reads ended within "
            "3 periods whatever its trigger ([operations.md](operations.md#is-it-running); a "
            "[duration](cli.md#durations))"))
        run_silence_floor: str = Field(default="60s", description=(
            "resets (409), `pipelines`, `/metrics`: for a run without a driver heartbeat (an earlier release's "
            "listener), the least silence after which it is presumed crashed; its bound is max(this, 3 x its "
            "longest batch, 3 x the longest gap the listener observed between its events) "
            "([operations.md](operations.md#is-it-running); a [duration](cli.md#durations))"))
        run_timeout: str = Field(default="10m", description=(
            "how long a run only a sink or `watch` records (no listener heartbeats) counts as running after its "
            "last batch (at least 3 x its longest batch); the state says `uncertain`. Also the bound of a "
            "listener run not heard from once since its start (its first batch may be a backlog) "
            "(a [duration](cli.md#durations))"))
        status_window: str = Field(default="5m", description=(
            "`lag`, `pipelines`, `/metrics`: the window the pipeline status (OK, LAGGING, STALLED, STOPPED, "
            "REWOUND) is evaluated over (a [duration](cli.md#durations))"))
        retention_warn: str = Field(default="1h", description=(
            "`lag`, `pipelines`, the console, `/metrics`: a partition whose retention headroom (time until "
            "retention may delete records the pipeline has not read) is below this is `WARN` "
            "(a [duration](cli.md#durations))"))

        def resolved_dsn(self, dsn: str | None = None) -> str:
            """The DSN to use: the argument, else OFFSET_LEDGER_DSN, else the embedded SQLite file."""
            if dsn:
                return dsn
            if self.dsn:
                return self.dsn
            return f"sqlite:///{self.home / 'ledger.db'}"

    _settings_class = Settings
    return Settings


_settings_class: Any = None


def __getattr__(name: str) -> Any:
    if name == "Settings":
        return settings_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def settings() -> Settings:
    """Read the environment now (not at import, so tests and CLIs can change it).

    Hot read paths (the activity rule on every pipelines-list request) ask for it, so the instance is
    reused while the environment is unchanged (building one: docs/benchmarks.md).
    The key is the environment's raw bytes (``os.environ`` decodes
    every name and value on each iteration, which cost more than the check is worth).
    """
    global _cached
    raw = getattr(os.environ, "_data", None)
    key = tuple(raw.items()) if isinstance(raw, dict) else tuple(os.environ.items())
    cached = _cached
    if cached is None or cached[0] != key:
        cached = _cached = (key, settings_class()())
    return cached[1]


_cached: tuple[tuple[tuple[object, object], ...], Settings] | None = None


def kafka_environment() -> dict[str, str]:
    """The ``OFFSET_LEDGER_KAFKA_*`` variables as they are now (``offset_ledger.kafka.client_config`` reads them)."""
    return {k: v for k, v in os.environ.items() if k.startswith("OFFSET_LEDGER_KAFKA_")}


#: Variables read by pattern, beside the fields above (``kafka_environment``).
PATTERN_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("OFFSET_LEDGER_KAFKA_COMMAND_CONFIG", "every Kafka client the package builds: a Java client properties "
     "file, as `--command-config` takes it ([cli.md](cli.md#reaching-kafka-secured-clusters))", "unset"),
    ("OFFSET_LEDGER_KAFKA_<PROPERTY>", "every Kafka client: one client property, lower-cased, `_` -> `.` "
     "(`OFFSET_LEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL`)", "unset"),
)


def settings_table() -> str:
    """docs/configuration.md's table of every setting, generated from ``Settings`` (and checked by a test)."""
    Settings = settings_class()
    prefix = Settings.model_config.get("env_prefix", "")
    lines = ["| variable | used by | default |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        shown = extra.get("shown_default")
        if shown is None:
            shown = "unset" if field.default is None else f"`{field.default}`"
        lines.append(f"| `{prefix}{name.upper()}` | {field.description} | {shown} |")
    lines += [f"| `{var}` | {what} | {default} |" for var, what, default in PATTERN_VARIABLES]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m offset_ledger.config: print the table for docs/configuration.md
    print(settings_table(), end="")
