"""``offset-ledger serve``: the REST API and the console, with the watchers ``--watch`` asks for."""

from __future__ import annotations

from typing import Optional

import typer

from offset_ledger.api.tokens import load_tokens, weak_token_names
from offset_ledger.cli.connections import KafkaOptions, LedgerOptions, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.watch import parse_watch_specs, start_watchers
from offset_ledger.config import settings
from offset_ledger.errors import ConfigError


@grouped
def serve_cmd(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (OFFSET_LEDGER_HOST; default: loopback)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port to listen on (OFFSET_LEDGER_PORT; default 9090)."),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Allow a non-loopback bind without OFFSET_LEDGER_API_TOKEN."),
    ledger: LedgerOptions = LedgerOptions(), kafka: KafkaOptions = KafkaOptions(),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    watch: Optional[list[str]] = typer.Option(
        None, "--watch", metavar="PIPELINE=CHECKPOINT",
        help="Also record this pipeline's batches from its checkpoint's commit log (as offset-ledger watch); "
             "repeatable."),
) -> None:
    """Run the REST API (legacy /v1 endpoints, /api/v1 resources, /docs, /metrics, /healthz)."""
    import ipaddress

    import uvicorn

    from offset_ledger.api import create_app

    s = settings()
    host = s.host if host is None else host
    if port is None:
        try:
            port = int(s.port)
        except ValueError:
            raise ConfigError(f"invalid OFFSET_LEDGER_PORT {s.port[:40]!r}: a port number, 1-65535") from None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    tokens = load_tokens(s)
    if not loopback and not tokens and not insecure:
        raise ConfigError(f"refusing to bind {host} without OFFSET_LEDGER_API_TOKEN; set a token or pass --insecure")
    weak = weak_token_names(tokens)
    if weak and not loopback:
        # --insecure does not cover this: a known or short token is no protection off loopback.
        raise ConfigError(f"refusing to bind {host} with a weak API token ({', '.join(weak)}: a known default or "
                          "shorter than 16 characters); make one with: python3 -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'")
    if not 0 < port < 65536:
        raise ConfigError(f"invalid --port {port}")
    cluster = kafka.address()

    specs = parse_watch_specs(watch or [])  # bad input fails before anything starts
    # With --watch serve records batches, and creates its ledger as watch does; without, a mistyped
    # path must not become an empty ledger.
    where = ledger.address(create=bool(specs))
    if not specs:
        # Refused at start, not answered with 503 on every request.
        open_operations(where).close()
    # The bound address is a name clients use; a wildcard bind names no host.
    hosts = [] if host in ("0.0.0.0", "::", "") else [host]
    # A busy port is one line and exit 2 before anything starts, never uvicorn's "[Errno 98]" after
    # "Application startup complete" (and exit 3).
    _check_port_free(host, port)
    app_ = create_app(s, dsn=where.dsn, bootstrap_servers=cluster.bootstrap_servers, kafka_options=cluster.options,
                      kafka_timeout_ms=cluster.timeout_ms, tokens=tokens, hosts=hosts)
    stop_watchers = start_watchers(specs, where)
    try:
        typer.echo(serve_banner(host, port, tokens), err=True)
        uvicorn.run(app_, host=host, port=port, log_level=log_level)
    finally:
        stop_watchers()


def _check_port_free(host: str, port: int) -> None:
    """ConfigError (exit 2) when ``host:port`` cannot be bound: in use, or an address not on this machine."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot bind --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT is free and only a listener is "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use (another offset-ledger serve?); "
                                  "stop that process or pass --port") from None
            raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None


def serve_banner(host: str, port: int, tokens: object) -> str:
    """Where ``serve`` listens (the console's URL) and whether requests need a token."""
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::", ""):
        shown = "127.0.0.1" if host != "::" else "[::1]"  # a wildcard bind answers on loopback too
    auth = ("tokens required (Authorization: Bearer ...; /healthz and /livez are open)" if tokens
            else "no token required (no OFFSET_LEDGER_API_TOKEN set)")
    return (f"offset-ledger serve: console http://{shown}:{port}/  API http://{shown}:{port}/api/v1  "
            f"docs http://{shown}:{port}/docs; {auth}; Ctrl-C stops it")


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the command line."""
    app.command("serve")(serve_cmd)
