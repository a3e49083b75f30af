"""docs/security.md's access table is the one ``offset-ledger db access`` generates from the grants
(``row_security.GUARDED``, the token roles): a grant changed in code and not in the doc fails here."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from offset_ledger.cli.main import app
from offset_ledger.cli.upkeep import access_table
from offset_ledger.ledger.row_security import GUARDED

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"


def _documented() -> str:
    found = re.search(r"<!-- access-table -->\n(.*?)<!-- /access-table -->", DOC.read_text(), flags=re.S)
    assert found, "docs/security.md has lost its access-table markers"
    return found.group(1).rstrip("\n")


def test_the_docs_table_is_the_generated_one() -> None:
    assert _documented() == access_table()


def test_db_access_prints_it() -> None:
    result = CliRunner().invoke(app, ["db", "access"])
    assert result.exit_code == 0 and result.output.rstrip("\n") == access_table()


def test_every_guarded_table_and_each_privilege_is_in_it() -> None:
    table = access_table()
    for g in GUARDED:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{g.table}` |"))
        for w in g.writes:
            word = w.lower() if "(" not in w else w[w.index("(") + 1:].split(",")[0].strip()
            assert word in row, (g.table, w, row)
        assert ("delete" in row) == g.deletes, row
