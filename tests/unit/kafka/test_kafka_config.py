"""Kafka client settings from every source (--kafka-option, --command-config, OFFSET_LEDGER_KAFKA_*)
end in one translation, with a precedence and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from offset_ledger.errors import ConfigError
from offset_ledger.kafka.adapter import client_configs
from offset_ledger.kafka.client_config import env_options, gather, parse_option_items, parse_properties

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="etl" password="pw";'


def test_properties_files_are_read_as_java_writes_them() -> None:
    text = ("# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
            '    username="etl" password="a=b:c";\n')
    assert parse_properties(text, source="f") == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="etl" password="a=b:c";'}
    with pytest.raises(ConfigError, match="line 1"):
        parse_properties("just words\n", source="f")


def test_every_source_translates_the_same_and_explicit_wins(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config={JAAS}\n")
    environ = {"OFFSET_LEDGER_KAFKA_SECURITY_PROTOCOL": "SSL", "OFFSET_LEDGER_KAFKA_REQUEST_TIMEOUT_MS": "7000",
               "OFFSET_LEDGER_KAFKA_VERSION": "3.9.2"}  # the devstack's broker version: not a client setting
    assert env_options(environ) == {"kafka.security.protocol": "SSL", "kafka.request.timeout.ms": "7000"}

    options = gather(["sasl.mechanism=SCRAM-SHA-256"], str(config))
    configs = client_configs("b:9092", options, environ=environ)
    assert configs == {
        "bootstrap_servers": ["b:9092"],
        "security_protocol": "SASL_PLAINTEXT",   # the file beats the environment
        "sasl_mechanism": "SCRAM-SHA-256",       # --kafka-option beats the file
        "sasl_plain_username": "etl", "sasl_plain_password": "pw",
        "request_timeout_ms": 7000,              # the environment fills what nothing else says
    }
    # The environment's own file comes under its single variables.
    environ_file = {"OFFSET_LEDGER_KAFKA_COMMAND_CONFIG": str(config), "OFFSET_LEDGER_KAFKA_SASL_MECHANISM": "X"}
    assert client_configs("b:9092", None, environ=environ_file)["sasl_mechanism"] == "X"
    assert client_configs("b:9092", None, environ=environ_file)["security_protocol"] == "SASL_PLAINTEXT"


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_option_items(["security.protocol"])
    with pytest.raises(ConfigError, match="milliseconds"):
        client_configs("b:9092", {"kafka.request.timeout.ms": "soon"}, environ={})
    with pytest.raises(ConfigError, match="cannot read --command-config"):
        gather(None, "/nonexistent/client.properties")
    assert parse_option_items(["kafka.a.b=1", "c.d=x=y"]) == {"kafka.a.b": "1", "kafka.c.d": "x=y"}
