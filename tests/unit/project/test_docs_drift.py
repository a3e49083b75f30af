"""Claims in the docs that drifted from the code (issue 50, item 6), each checked against the code:
the exit code of an import over existing positions, the schema revision /healthz answers, and the
places docker-compose.yml sends its reader to."""

from __future__ import annotations

import re
from pathlib import Path

from offset_ledger.errors import AdoptionRefused, exit_code

ROOT = Path(__file__).resolve().parents[3]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def _headings(path: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")}


def test_an_import_over_existing_positions_is_the_exit_code_the_docs_say() -> None:
    (claim,) = re.findall(r"already has positions or generations is refused \(exit (\d)\)", OPERATIONS)
    assert int(claim) == exit_code(AdoptionRefused("orders", "orders", {"topics": ["orders"], "generations": 1}))


def test_the_healthz_example_shows_todays_schema() -> None:
    from offset_ledger.ledger.engine import head_revision

    (shown,) = re.findall(r'"ledger": \{"reachable": true, "schema": "(\d+)"\}', OPERATIONS)
    assert shown == head_revision()


def test_docker_compose_points_to_places_that_exist() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    refs = re.findall(r'(README(?:\.md)?|docs/[\w-]+\.md|tests/[\w/]+\.py)(?:,\s*"?([A-Z][\w ]*[\w])"?)?', text)
    assert refs, "docker-compose.yml names no doc"
    for path, section in refs:
        file = ROOT / (path if path.endswith((".md", ".py")) else path + ".md")
        assert file.is_file(), f"docker-compose.yml names {path}, which does not exist"
        if section:
            assert section in _headings(file), f"docker-compose.yml names section {section!r} of {path}"


def test_the_spark_4_1_1_claim_says_what_to_do_about_spark_55271() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "| 4.1.1 |" in readme  # the claim: the matrix runs PySpark 4.1.1
    note = readme[readme.index("SPARK-55271"):][:900]
    assert "NullPointerException" in note and "start the query again" in note and "nothing is lost" in note
