"""The compatibility matrix's record keeper (``scripts/test --matrix`` calls it; standard library only).

``record`` appends one cell (a PySpark venv or a broker run) to ``<out>/runs.jsonl`` from facts it
reads itself: the venv's PySpark version, the connector jar on ``spark.jars``, pytest's JUnit XML.
``report`` writes ``<out>/summary.json`` and ``<out>/compatibility.md`` (the README's table) and
prints the table and a closing ``matrix: N passed, N failed`` line. Under CI a skipped test fails
the matrix: a missing piece must never look like a pass. ``readme`` pastes the last table into
README.md between its ``matrix:begin``/``matrix:end`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _junit_counts(path: Path) -> dict[str, int]:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if not path.exists():
        return counts
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    return counts


def _pyspark_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('pyspark'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def _connector(spark_jars: str) -> str:
    """``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0`` from the jar on spark.jars."""
    for jar in spark_jars.split(","):
        found = re.fullmatch(r"(spark-sql-kafka-0-10_(\d+\.\d+))-(.+)\.jar", Path(jar).name)
        if found:
            return f"org.apache.spark:{found.group(1)}:{found.group(3)}"
    return "?"


def record(args: argparse.Namespace) -> int:
    out = Path(args.out)
    counts = _junit_counts(out / f"{args.name}.xml")
    connector = _connector(args.spark_jars)
    cell = {
        "name": args.name,
        "pyspark": _pyspark_version(args.python),
        "session": "Spark Connect" if args.connect == "1" else "classic",
        "scala": connector.split(":")[1].rsplit("_", 1)[-1] if connector != "?" else "?",
        "connector": connector,
        "kafka": args.kafka,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": counts["failures"] + counts["errors"],
        "skipped": counts["skipped"],
        "pytest_exit": int(args.rc),
        "seconds": int(args.seconds),
        "tests": "compat" if args.name.startswith("pyspark-") else "kafka_broker",
    }
    with (out / "runs.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(cell) + "\n")
    return 0


def _table(cells: list[dict[str, Any]]) -> str:
    lines = ["| PySpark | session | Scala | connector | Kafka broker | tests | result | time |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        result = f"{c['passed']} passed, {c['failed']} failed" + (f", {c['skipped']} skipped" if c["skipped"] else "")
        if c["pytest_exit"] != 0 and c["failed"] == 0:
            result += f" (pytest exit {c['pytest_exit']})"
        lines.append(f"| {c['pyspark']} | {c['session']} | {c['scala']} | `{c['connector']}` | "
                     f"Apache Kafka {c['kafka']} | `{c['tests']}` | {result} | {c['seconds']} s |")
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace) -> int:
    out = Path(args.out)
    runs = out / "runs.jsonl"
    cells = [json.loads(line) for line in runs.read_text().splitlines() if line.strip()] if runs.exists() else []
    passed = sum(c["passed"] for c in cells)
    failed = sum(c["failed"] for c in cells) + sum(1 for c in cells if c["pytest_exit"] != 0 and c["failed"] == 0)
    skipped = sum(c["skipped"] for c in cells)
    summary = {"cells": cells, "passed": passed, "failed": failed, "skipped": skipped,
               "wall_seconds": int(args.seconds)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = _table(cells)
    (out / "compatibility.md").write_text(table)
    print(f"\n== compatibility matrix ({args.seconds} s)\n{table}")
    if os.environ.get("CI") and skipped:
        print(f"matrix: {skipped} skipped under CI; a missing piece is a failure", file=sys.stderr)
        failed += skipped
    if not cells:
        print("matrix: no cell ran; that is a failure", file=sys.stderr)
        failed += 1
    print(f"matrix: {passed} passed, {failed} failed")
    return 1 if failed else 0


BEGIN, END = "<!-- matrix:begin (scripts/matrix_summary.py readme) -->", "<!-- matrix:end -->"


def readme(args: argparse.Namespace) -> int:
    path = Path(args.readme)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        print(f"{path}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    table = (Path(args.out) / "compatibility.md").read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/matrix_summary.py")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    for flag in ("--out", "--name", "--python", "--kafka", "--rc", "--seconds", "--connect", "--spark-jars"):
        rec.add_argument(flag, required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--out", required=True)
    rep.add_argument("--seconds", required=True)
    pasted = sub.add_parser("readme")
    pasted.add_argument("--out", default=".matrix")
    pasted.add_argument("--readme", default="README.md")
    args = parser.parse_args(argv)
    return {"record": record, "report": report, "readme": readme}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
