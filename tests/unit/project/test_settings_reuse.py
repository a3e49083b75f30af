"""settings() is reused while the environment is unchanged, and re-read as soon as it changes."""

from __future__ import annotations

from offset_ledger.config import settings


def test_settings_follow_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OFFSET_LEDGER_RUN_TIMEOUT", "7m")
    first = settings()
    assert first.run_timeout == "7m"
    assert settings() is first  # nothing changed: the same instance, not another ~1 ms parse

    monkeypatch.setenv("OFFSET_LEDGER_RUN_TIMEOUT", "9m")
    assert settings().run_timeout == "9m"
    monkeypatch.setenv("offset_ledger_status_window", "2m")  # pydantic matches names case-insensitively
    assert settings().status_window == "2m"
    monkeypatch.delenv("offset_ledger_status_window")
    assert settings().status_window == "5m"
    monkeypatch.setenv("HOME", str(tmp_path))  # the default home follows HOME
    assert settings().home == tmp_path / ".local" / "share" / "offset-ledger"
