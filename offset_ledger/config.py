"""Settings from arguments and ``OFFSET_LEDGER_*`` environment variables (the only env reader)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    """Where the embedded SQLite ledger and the listener's spool live unless told otherwise."""
    return Path.home() / ".local" / "share" / "offset-ledger"


class Settings(BaseSettings):
    """Every ``OFFSET_LEDGER_*`` variable; an explicit argument always wins over the environment."""

    model_config = SettingsConfigDict(env_prefix="OFFSET_LEDGER_", extra="ignore")

    dsn: str | None = Field(default=None, description="SQLAlchemy URL of the ledger database")
    home: Path = Field(default_factory=default_home, description="embedded ledger and spool directory")
    bootstrap_servers: str | None = Field(default=None, description="Kafka bootstrap servers")
    api_token: str | None = Field(default=None, description="bearer token the REST API requires (an operate token)")
    api_tokens: str | None = Field(default=None, description="named tokens: name:role:secret, comma-separated "
                                                             "(role read or operate)")
    api_tokens_file: Path | None = Field(default=None, description="a file of name:role:secret lines")
    allowed_hosts: str | None = Field(default=None, description="Host names the API answers besides loopback "
                                                                "(comma-separated; * for any)")
    run_silence_floor: str = Field(default="60s", description="least silence after which a run the listener "
                                                              "watches is presumed crashed (its bound: at least "
                                                              "3 x its longest batch and 3 x its longest gap "
                                                              "between events)")
    run_timeout: str = Field(default="10m", description="how long a run only a sink or the watcher records (no "
                                                        "listener heartbeats) counts as running after its last "
                                                        "batch (at least 3 x its longest batch)")
    status_window: str = Field(default="5m", description="window the pipeline status (OK, LAGGING, STALLED, "
                                                          "STOPPED, REWOUND) is evaluated over")
    retention_warn: str = Field(default="1h", description="retention headroom below which a partition is WARN "
                                                          "(retention may soon delete records it has not read)")

    def resolved_dsn(self, dsn: str | None = None) -> str:
        """The DSN to use: the argument, else OFFSET_LEDGER_DSN, else the embedded SQLite file."""
        if dsn:
            return dsn
        if self.dsn:
            return self.dsn
        return f"sqlite:///{self.home / 'ledger.db'}"


def settings() -> Settings:
    """Read the environment now (not at import, so tests and CLIs can change it).

    Building ``Settings`` costs ~1 ms (pydantic-settings inspects every field), and hot read paths
    (the activity rule on every pipelines-list request) ask for it; the instance is reused while
    the environment is unchanged. The key is the environment's raw bytes (``os.environ`` decodes
    every name and value on each iteration, which cost more than the check is worth).
    """
    global _cached
    raw = getattr(os.environ, "_data", None)
    key = tuple(raw.items()) if isinstance(raw, dict) else tuple(os.environ.items())
    cached = _cached
    if cached is None or cached[0] != key:
        cached = _cached = (key, Settings())
    return cached[1]


_cached: tuple[tuple[tuple[object, object], ...], Settings] | None = None


def kafka_environment() -> dict[str, str]:
    """The ``OFFSET_LEDGER_KAFKA_*`` variables as they are now (``offset_ledger.kafka.client_config`` reads them)."""
    return {k: v for k, v in os.environ.items() if k.startswith("OFFSET_LEDGER_KAFKA_")}
