"""docs/configuration.md lists every setting because it is generated from the settings class (issue 34)."""

from __future__ import annotations

from pathlib import Path

from offset_ledger.config import PATTERN_VARIABLES, Settings, settings_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_page_holds_the_generated_table() -> None:
    text = DOC.read_text()
    assert settings_table() in text, "regenerate: python -m offset_ledger.config, into docs/configuration.md"


def test_every_setting_has_a_row_with_words() -> None:
    table = settings_table()
    for name, field in Settings.model_fields.items():
        assert f"`OFFSET_LEDGER_{name.upper()}`" in table
        assert field.description and len(field.description) > 10, name
    for var, _what, _default in PATTERN_VARIABLES:
        assert f"`{var}`" in table


def test_every_variable_the_code_reads_is_a_setting() -> None:
    """An OFFSET_LEDGER_* name in the package's code is a setting, a pattern, or a test/dev variable."""
    import re

    package = Path(__file__).resolve().parents[3] / "offset_ledger"
    named = {m for p in package.rglob("*.py") for m in re.findall(r"OFFSET_LEDGER_[A-Z_]+[A-Z]", p.read_text())}
    known = {f"OFFSET_LEDGER_{n.upper()}" for n in Settings.model_fields}
    patterns = ("OFFSET_LEDGER_KAFKA", "OFFSET_LEDGER_TEST_", "OFFSET_LEDGER_DEMO_TRACEBACK", "OFFSET_LEDGER_SPARK_JARS", "OFFSET_LEDGER_STACK_DIR",
                "OFFSET_LEDGER_CACHE", "OFFSET_LEDGER_VENV", "OFFSET_LEDGER_KAFKA_VERSION")
    left = sorted(n for n in named - known if not n.startswith(patterns))
    assert left == [], f"document these in offset_ledger.config.Settings: {left}"
