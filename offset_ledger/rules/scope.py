"""Pipeline scopes: which pipelines a caller may see, as exact names and prefix patterns (pure).

A scope is written as patterns separated by ``|``: an exact pipeline name (``orders``) or a prefix
ending in one ``*`` (``team-a-*``: every pipeline whose name starts with ``team-a-``), like Kafka's
literal and prefixed ACLs. ``*`` alone is every pipeline. A scoped API token sees only the pipelines
its scope allows; the same patterns name a team's pipelines in ``offset-ledger db grant``
(PostgreSQL row-level security), where a prefix becomes ``LIKE 'team-a-%'``.

No pattern has a wildcard anywhere but at its end: a name is matched by a plain comparison, so what a
pattern allows can be read off it, and SQL's ``LIKE`` specials (``%``, ``_``, ``\\``) in a prefix are
escaped when it is turned into SQL (``like_prefix``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from offset_ledger.errors import InvalidInput

#: Separates the patterns of one scope (a comma separates token entries, so it cannot).
SEPARATOR = "|"
MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 255


@dataclass(frozen=True)
class PipelineScope:
    """Exact names and prefixes; ``unrestricted`` sees every pipeline (a token without a scope)."""

    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    unrestricted: bool = False

    def allows(self, pipeline: str | None) -> bool:
        """Whether ``pipeline`` is inside the scope (a row without a pipeline is only for the unrestricted)."""
        if self.unrestricted:
            return True
        if pipeline is None:
            return False
        return pipeline in self.exact or any(pipeline.startswith(p) for p in self.prefixes)

    def visible(self, names: Iterable[str]) -> list[str]:
        """``names`` inside the scope, in their order."""
        return [n for n in names if self.allows(n)]

    @property
    def patterns(self) -> tuple[str, ...]:
        """The scope as written: exact names, then prefixes with their ``*``, each sorted."""
        if self.unrestricted:
            return ("*",)
        return tuple(sorted(self.exact)) + tuple(p + "*" for p in sorted(self.prefixes))

    def __str__(self) -> str:
        return SEPARATOR.join(self.patterns)


EVERYTHING = PipelineScope(unrestricted=True)


def parse_scope(text: str, *, separators: str = SEPARATOR) -> PipelineScope:
    """``orders|team-a-*`` -> a scope; InvalidInput naming the bad pattern (empty, control characters,
    a ``*`` not at the end, more than one ``*``). ``separators``: every character that separates patterns."""
    raw = [text]
    for sep in separators:
        raw = [piece for part in raw for piece in part.split(sep)]
    patterns = [p.strip() for p in raw]
    if not any(patterns):
        raise InvalidInput("a pipeline scope needs at least one name or prefix (like orders|team-a-*)")
    if len(patterns) > MAX_PATTERNS:
        raise InvalidInput(f"a pipeline scope has at most {MAX_PATTERNS} patterns, not {len(patterns)}")
    exact: set[str] = set()
    prefixes: set[str] = set()
    for p in patterns:
        if not p:
            raise InvalidInput(f"empty pattern in pipeline scope {text[:100]!r}")
        if len(p) > MAX_PATTERN_LENGTH or any(ord(c) < 32 or ord(c) == 127 for c in p):
            raise InvalidInput(f"pipeline scope pattern {p[:60]!r} is too long or holds a control character")
        if p == "*":
            return EVERYTHING
        if "*" in p[:-1]:
            raise InvalidInput(f"pipeline scope pattern {p[:60]!r}: '*' may only end a prefix (like team-a-*)")
        if p.endswith("*"):
            prefixes.add(p[:-1])
        else:
            exact.add(p)
    # A prefix covers the exact names and longer prefixes it starts: keep the scope minimal.
    kept = sorted(p for p in prefixes if not any(p != q and p.startswith(q) for q in prefixes))
    return PipelineScope(frozenset(n for n in exact if not any(n.startswith(q) for q in kept)), tuple(kept))


def like_prefix(prefix: str) -> str:
    """A prefix as a SQL ``LIKE`` pattern with ``\\`` as the escape: ``a_b`` -> ``a\\_b%``."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
