"""docker-compose.yml agrees with the code: no Docker engine here, so the file itself is checked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from offset_ledger import devstack
from offset_ledger.config import Settings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for spec in service.get("ports", []):
        host, container = str(spec).rsplit(":", 1)[-2:] if ":" in str(spec) else (spec, spec)
        out[int(container)] = int(str(host).rsplit(":", 1)[-1])
    return out


def _serve_port_default() -> int:
    """The default --port of `offset-ledger serve`, read from the command itself."""
    import typer

    from offset_ledger.cli.main import app

    command = typer.main.get_command(app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]
    (port,) = [p for p in serve.params if p.name == "port"]
    if port.default is None:  # the default is the setting's (OFFSET_LEDGER_PORT)
        from offset_ledger.config import Settings

        return int(Settings.model_fields["port"].default)
    return int(port.default)


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "postgres", "api"}


def test_kafka_is_the_official_image_in_kraft_mode(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    image, tag = kafka["image"].split(":")
    assert image == "apache/kafka" and tag == devstack.KAFKA_VERSION
    env = _env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node_id}@kafka:")
    listeners = dict(re.findall(r"(\w+)://[^:]*:(\d+)", env["KAFKA_LISTENERS"]))
    advertised = dict(re.findall(r"(\w+)://([^,]+)", env["KAFKA_ADVERTISED_LISTENERS"]))
    protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols) == set(advertised) | {env["KAFKA_CONTROLLER_LISTENER_NAMES"]}
    # The host listener is published on the same port it advertises.
    host_port = int(advertised["EXTERNAL"].rsplit(":", 1)[1])
    assert advertised["EXTERNAL"].startswith("localhost:")
    assert _published(kafka)[int(listeners["EXTERNAL"])] == host_port == 9092
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_api_env_is_wired_to_the_other_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    api, pg, kafka = services["api"], services["postgres"], services["kafka"]
    env = _env(api)
    # Every variable the service sets is one the code reads.
    assert all(k.removeprefix("OFFSET_LEDGER_").lower() in Settings.model_fields for k in env)
    dsn = make_url(env["OFFSET_LEDGER_DSN"])
    pg_env = _env(pg)
    assert dsn.get_backend_name() == "postgresql" and dsn.get_driver_name() == "psycopg2"
    assert (dsn.host, dsn.port) == ("postgres", 5432)
    assert (dsn.username, dsn.password, dsn.database) == (
        pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"])
    internal = dict(re.findall(r"(\w+)://([^,]+)", _env(kafka)["KAFKA_ADVERTISED_LISTENERS"]))["INTERNAL"]
    assert env["OFFSET_LEDGER_BOOTSTRAP_SERVERS"] == internal == "kafka:19092"
    # Listening on 0.0.0.0 needs a token.
    assert env["OFFSET_LEDGER_API_TOKEN"]
    assert Settings(**{"dsn": env["OFFSET_LEDGER_DSN"]}).resolved_dsn() == env["OFFSET_LEDGER_DSN"]
    assert set(api["depends_on"]) == {"kafka", "postgres"}
    assert all(v["condition"] == "service_healthy" for v in api["depends_on"].values())
    assert all("healthcheck" in services[name] for name in api["depends_on"])


def test_api_port_and_command_match_the_cli(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    port = _serve_port_default()
    assert port == 9090
    assert _published(api) == {port: port}
    command = " ".join(api["command"])
    assert "offset-ledger db upgrade && offset-ledger serve --host 0.0.0.0" in command
    assert f"127.0.0.1:{port}/healthz" in " ".join(api["healthcheck"]["test"])


def test_api_is_built_from_the_dockerfile(compose: dict[str, Any]) -> None:
    build = compose["services"]["api"]["build"]
    dockerfile = ROOT / build["context"] / build["dockerfile"]
    text = dockerfile.read_text()
    base = re.search(r"^FROM python:(\d+)\.(\d+)", text, re.M)
    assert base and (int(base.group(1)), int(base.group(2))) >= (3, 10)
    assert "pip install '.[server]'" in text  # the API needs the server extra
    assert re.search(r"^COPY offset_ledger ", text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M)
    assert "EXPOSE 9090" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".devstack" in ignored


def test_postgres_is_published_for_spark_jobs_on_the_host(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    assert pg["image"].split(":")[0] == "postgres"
    assert _published(pg) == {5432: 5432}


def test_token_is_required_and_ports_are_loopback_only(compose: dict[str, Any]) -> None:
    token = _env(compose["services"]["api"])["OFFSET_LEDGER_API_TOKEN"]
    # ${VAR:?message}: compose stops with the message when the token is unset or empty; no default.
    assert re.fullmatch(r"\$\{OFFSET_LEDGER_API_TOKEN:\?[^}]+\}", token), token
    for name, service in compose["services"].items():
        for spec in service.get("ports", []):
            assert str(spec).startswith("127.0.0.1:"), (name, spec)
