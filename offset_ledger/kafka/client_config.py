"""Where Kafka client settings come from: ``--kafka-option``, ``--command-config FILE`` and
``OFFSET_LEDGER_KAFKA_*``, gathered into one Spark-style option map (``kafka.``-prefixed Java
property names) that ``offset_ledger.kafka.adapter.client_configs`` translates for kafka-python.

Precedence, highest first: ``--kafka-option``, then the ``--command-config`` file, then the
individual ``OFFSET_LEDGER_KAFKA_<PROPERTY>`` variables, then the file named by
``OFFSET_LEDGER_KAFKA_COMMAND_CONFIG``. The environment layer applies to every client this package
builds (CLI, ``serve``, ``start_from_ledger``, the listener), so one set of variables reaches a
secured cluster from everywhere.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from offset_ledger.config import kafka_environment
from offset_ledger.errors import ConfigError

log = logging.getLogger(__name__)

ENV_PREFIX = "OFFSET_LEDGER_KAFKA_"
COMMAND_CONFIG_ENV = ENV_PREFIX + "COMMAND_CONFIG"
# OFFSET_LEDGER_KAFKA_VERSION picks the devstack's broker; it is not a client setting.
_NOT_CLIENT_SETTINGS = frozenset({"COMMAND_CONFIG", "VERSION"})


def spark_key(key: str) -> str:
    """A client property as the Spark reader spells it: ``security.protocol`` -> ``kafka.security.protocol``."""
    key = key.strip()
    return key if key.startswith("kafka.") else f"kafka.{key}"


def parse_properties(text: str, *, source: str) -> dict[str, str]:
    """A Java ``.properties`` document (``key=value`` or ``key: value``, ``#``/``!`` comments,
    backslash line continuations), as Kafka's ``--command-config`` files are written."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if not pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for number, line in enumerate(logical, 1):
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise ConfigError(f"{source}: line {number} is not KEY=VALUE: {line[:80]!r}", source=source)
        key, value = line[:cut].strip(), line[cut + 1:].strip()
        if not key:
            raise ConfigError(f"{source}: line {number} has no key", source=source)
        out[key] = value
    return out


def read_command_config(path: str | os.PathLike[str]) -> dict[str, str]:
    """A Kafka tools ``--command-config`` file as ``kafka.``-prefixed options."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read --command-config {str(path)!r}: {exc.strerror or exc}",
                          path=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read --command-config {str(path)!r}: not UTF-8 text (byte {exc.start})",
                          path=str(path)) from exc
    return {spark_key(k): v for k, v in parse_properties(text, source=str(path)).items()}


def parse_option_items(items: Sequence[str] | None) -> dict[str, str]:
    """``--kafka-option KEY=VALUE`` values; a bare Java property gets the ``kafka.`` prefix."""
    options: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-option must be KEY=VALUE, not {item!r}", option=item[:80])
        options[spark_key(key)] = value
    return options


def env_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``OFFSET_LEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` -> ``{"kafka.security.protocol": "SASL_SSL"}``,
    over the file ``OFFSET_LEDGER_KAFKA_COMMAND_CONFIG`` names (Java property names have no ``_``)."""
    env = kafka_environment() if environ is None else environ
    out: dict[str, str] = {}
    if env.get(COMMAND_CONFIG_ENV):
        out.update(read_command_config(env[COMMAND_CONFIG_ENV]))
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            rest = name[len(ENV_PREFIX):]
            if rest and rest not in _NOT_CLIENT_SETTINGS:
                out["kafka." + rest.lower().replace("_", ".")] = value
    return out


def gather(kafka_option: Sequence[str] | None = None, command_config: str | None = None) -> dict[str, str]:
    """The options a command line names: the ``--command-config`` file under ``--kafka-option`` items.

    The environment is merged later, by ``client_configs`` (so the Python API gets it too).
    """
    options: dict[str, str] = {}
    if command_config:
        options.update(read_command_config(command_config))
    options.update(parse_option_items(kafka_option))
    return options


def with_environment(options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``options`` over the ``OFFSET_LEDGER_KAFKA_*`` layer (explicit options win)."""
    merged: dict[str, Any] = dict(env_options(environ))
    merged.update(options or {})
    return merged


# Java client property -> kafka-python config key (the ones that matter for reaching a cluster).
_JAVA_TO_PYTHON = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.truststore.location": "ssl_cafile",      # PEM only: kafka-python cannot read JKS
    "ssl.keystore.location": "ssl_certfile",      # PEM only
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
    "request.timeout.ms": "request_timeout_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}


# Consumer tuning that Spark users set on the reader and that has no meaning for our questions.
_IGNORED_PREFIXES = ("max.", "fetch.", "session.", "heartbeat.", "auto.", "group.", "enable.",
                     "isolation.", "receive.", "send.", "key.", "value.", "default.api.")


_JAAS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def client_configs(bootstrap_servers: str, options: Mapping[str, Any] | None = None,
                   *, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Translate Spark-style reader options (``kafka.security.protocol`` ...) into kafka-python configs.

    ``options`` win over the ``OFFSET_LEDGER_KAFKA_*`` settings (``offset_ledger.kafka.client_config``),
    which are merged here so that every client of this package reaches the same cluster the same way.
    """
    if not bootstrap_servers or not str(bootstrap_servers).strip():
        raise ConfigError("no Kafka bootstrap servers given (--bootstrap-server or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    configs: dict[str, Any] = {"bootstrap_servers": [s.strip() for s in str(bootstrap_servers).split(",") if s.strip()]}
    for raw_key, value in with_environment(options, environ).items():
        key = raw_key[len("kafka."):] if raw_key.startswith("kafka.") else raw_key
        if key == "sasl.jaas.config":
            # PLAIN/SCRAM logins carry username and password inside the JAAS line.
            fields = dict(_JAAS.findall(str(value)))
            if "username" in fields:
                configs["sasl_plain_username"] = fields["username"]
            if "password" in fields:
                configs["sasl_plain_password"] = fields["password"]
        elif key == "ssl.endpoint.identification.algorithm":
            configs["ssl_check_hostname"] = bool(str(value).strip())
        elif key in ("ssl.truststore.type", "ssl.keystore.type"):
            if str(value).upper() not in ("PEM", ""):
                raise ConfigError(f"{raw_key}={value}: only PEM trust/key stores are supported here", option=raw_key)
        elif key in _JAVA_TO_PYTHON:
            target = _JAVA_TO_PYTHON[key]
            if target.endswith("_ms"):
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise ConfigError(f"{raw_key}={value!r}: expected milliseconds (an integer)",
                                      option=raw_key) from None
            elif target == "bootstrap_servers":
                value = [s.strip() for s in str(value).split(",") if s.strip()]
            configs[target] = value
        elif key.startswith(_IGNORED_PREFIXES) or not raw_key.startswith("kafka."):
            continue  # reader-only options (startingOffsets, subscribe, ...) and consumer tuning
        elif "_" in key and "." not in key:
            configs[key] = value  # already a kafka-python key
        else:
            log.debug("ignoring Kafka option %s for offset look-ups", raw_key)
    return configs
