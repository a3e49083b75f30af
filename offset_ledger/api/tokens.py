"""API tokens: each has a name (the audit actor), a role (``read`` sees; ``operate`` may also reset) and
optionally a pipeline scope: ``name:role[orders|team-a-*]:secret`` sees only the pipeline ``orders``
and those whose names start with ``team-a-`` (``offset_ledger.rules.scope``); outside it a pipeline
does not exist for that token. ``name:role:secret`` (no brackets) sees every pipeline.

Sources, merged: ``OFFSET_LEDGER_API_TOKENS`` (``name:role:secret`` entries separated by commas or
newlines), the file named by ``OFFSET_LEDGER_API_TOKENS_FILE`` (one entry per line, ``#`` comments),
and the older ``OFFSET_LEDGER_API_TOKEN`` (one secret: an ``operate`` token named ``api-token``).
No token at all means no authentication (``serve`` allows that only on loopback).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from offset_ledger.errors import ConfigError, InvalidInput
from offset_ledger.rules.scope import EVERYTHING, PipelineScope, parse_scope

if TYPE_CHECKING:
    from offset_ledger.config import Settings

Role = Literal["read", "operate"]
ROLES: tuple[Role, ...] = ("read", "operate")
LEGACY_TOKEN_NAME = "api-token"
#: Scope key under which the API's auth middleware leaves the authenticated ``ApiToken``.
PRINCIPAL = "offset_ledger.principal"
MIN_SECRET_LENGTH = 16
# Secrets that appear in examples and defaults: a scanner tries them first.
KNOWN_WEAK = frozenset({"change-me", "changeme", "secret", "s3cret", "password", "token", "admin", "test"})
_TOKEN_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
# name:role[scope]:secret; the scope (optional) may hold ':' but not ']'.
_ENTRY = re.compile(r"^(?P<name>[^:]*):(?P<role>[^:\[]*)(?:\[(?P<scope>[^\]]*)\])?:(?P<secret>.*)$", re.DOTALL)


@dataclass(frozen=True)
class ApiToken:
    """One accepted bearer token; ``secret`` never leaves this process (it is not in ``repr``)."""

    name: str
    role: Role
    secret: bytes = b""
    scope: PipelineScope = EVERYTHING

    def __repr__(self) -> str:
        scope = "" if self.scope.unrestricted else f", scope={str(self.scope)!r}"
        return f"ApiToken(name={self.name!r}, role={self.role!r}{scope})"

    @property
    def may_operate(self) -> bool:
        return self.role == "operate"


def parse_tokens(text: str, source: str) -> list[ApiToken]:
    """``name:role:secret`` or ``name:role[scope]:secret`` entries (commas or newlines between them,
    ``#`` starts a comment)."""
    out: list[ApiToken] = []
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0]
        for entry in (e.strip() for e in line.split(",")):
            if not entry:
                continue
            found = _ENTRY.match(entry)
            if found:
                name, role, scope_text, secret = found.group("name", "role", "scope", "secret")
            else:
                name, role, secret = (entry.split(":", 2) + ["", ""])[:3]
                scope_text = None
            name, role, secret = name.strip(), role.strip(), secret.strip()
            if not _TOKEN_NAME.match(name):
                raise ConfigError(f"{source}: invalid token name {name[:40]!r}; use 1-64 of A-Z a-z 0-9 . _ @ - "
                                  "in name:role:secret")
            if role not in ROLES:
                raise ConfigError(f"{source}: token {name!r} has role {role[:20]!r}; use read or operate")
            if not secret or any(c.isspace() for c in secret):
                raise ConfigError(f"{source}: token {name!r} has an empty secret or one with spaces")
            scope = EVERYTHING
            if scope_text is not None:
                try:
                    scope = parse_scope(scope_text)
                except InvalidInput as exc:
                    raise ConfigError(f"{source}: token {name!r}: {exc.message}") from exc
            out.append(ApiToken(name, role, secret.encode(), scope))  # type: ignore[arg-type]
    return out


def load_tokens(settings: Settings, api_token: str | None = None) -> list[ApiToken]:
    """Every configured token; ``api_token`` (an argument) replaces ``OFFSET_LEDGER_API_TOKEN``."""
    tokens: list[ApiToken] = []
    single = api_token if api_token is not None else settings.api_token
    if single:
        tokens.append(ApiToken(LEGACY_TOKEN_NAME, "operate", single.strip().encode()))
    if settings.api_tokens:
        tokens += parse_tokens(settings.api_tokens, "OFFSET_LEDGER_API_TOKENS")
    if settings.api_tokens_file:
        path = Path(settings.api_tokens_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read OFFSET_LEDGER_API_TOKENS_FILE {str(path)!r}: {exc}") from exc
        tokens += parse_tokens(text, str(path))
    names = [t.name for t in tokens]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate API token name(s): {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    if len({t.secret for t in tokens}) != len(tokens):
        raise ConfigError("two API tokens share a secret; each token needs its own")
    return tokens


def weak_token_names(tokens: Sequence[ApiToken]) -> list[str]:
    """Names of tokens whose secret is a known default or shorter than 16 characters."""
    return [t.name for t in tokens
            if len(t.secret) < MIN_SECRET_LENGTH or t.secret.decode(errors="replace").lower() in KNOWN_WEAK]


def authenticate(tokens: Sequence[ApiToken], credential: bytes) -> ApiToken | None:
    """The token whose secret is ``credential``; every secret is compared, each in constant time."""
    found = None
    for token in tokens:
        if hmac.compare_digest(credential, token.secret):
            found = token
    return found
