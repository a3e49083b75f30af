"""The schema head every start compares with is the one Alembic finds among the migration scripts."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from offset_ledger.ledger.engine import SCHEMA_HEAD, _alembic_config, head_revision


def test_the_written_head_is_the_scripts_one_and_only_head() -> None:
    scripts = ScriptDirectory.from_config(_alembic_config(None))  # type: ignore[arg-type]
    assert scripts.get_heads() == [SCHEMA_HEAD], (
        "a migration was added: set ledger.engine.SCHEMA_HEAD to its revision")
    assert head_revision() == SCHEMA_HEAD
