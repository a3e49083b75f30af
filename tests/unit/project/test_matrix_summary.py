"""scripts/matrix_summary.py: the matrix's table comes from pytest's own JUnit counts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("matrix_summary", ROOT / "scripts" / "matrix_summary.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = ('<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="{e}" failures="{f}" '
         'skipped="{s}" tests="{t}"/></testsuites>')


def _record(ms, out: Path, name: str, *, t: int, f: int = 0, s: int = 0, rc: int = 0, connect: str = "0") -> None:  # type: ignore[no-untyped-def]
    (out / f"{name}.xml").write_text(JUNIT.format(e=0, f=f, s=s, t=t))
    jars = "/c/kafka-clients-3.9.2.jar,/c/spark-sql-kafka-0-10_2.12-3.5.7.jar"
    assert ms.main(["record", "--out", str(out), "--name", name, "--python", sys.executable, "--kafka", "4.1.1",
                    "--rc", str(rc), "--seconds", "12", "--connect", connect, "--spark-jars", jars]) == 0


def test_report_counts_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CI", raising=False)
    ms = _module()
    _record(ms, tmp_path, "pyspark-3.5.7", t=4)
    _record(ms, tmp_path, "pyspark-4.2.0-connect", t=3, f=1, rc=1, connect="1")
    assert ms.main(["report", "--out", str(tmp_path), "--seconds", "99"]) == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("matrix: 6 passed, 1 failed")
    assert "| `org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7` |" in out and "| 2.12 |" in out
    assert "| Spark Connect |" in out and "2 passed, 1 failed" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["passed"], summary["failed"], summary["wall_seconds"]) == (6, 1, 99)


def test_a_skip_fails_the_matrix_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    ms = _module()
    _record(ms, tmp_path, "kafka-3.9.2", t=4, s=1)
    monkeypatch.delenv("CI", raising=False)
    assert ms.main(["report", "--out", str(tmp_path), "--seconds", "1"]) == 0
    monkeypatch.setenv("CI", "true")
    assert ms.main(["report", "--out", str(tmp_path), "--seconds", "1"]) == 1
    assert "skipped under CI" in capsys.readouterr().err


def test_no_cell_is_a_failure(tmp_path: Path) -> None:
    assert _module().main(["report", "--out", str(tmp_path), "--seconds", "1"]) == 1


def test_readme_paste_replaces_only_between_the_markers(tmp_path: Path) -> None:
    ms = _module()
    (tmp_path / "compatibility.md").write_text("| new |\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{ms.BEGIN}\n| old |\n{ms.END}\nbottom\n")
    assert ms.main(["readme", "--out", str(tmp_path), "--readme", str(readme)]) == 0
    assert readme.read_text() == f"top\n{ms.BEGIN}\n| new |\n{ms.END}\nbottom\n"
    assert ROOT.joinpath("README.md").read_text().count(ms.BEGIN) == 1
