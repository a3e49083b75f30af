"""scripts/demo shows progress while Maven downloads on a first run (issue 50, item 1): what is being
resolved and how many MB have come down. A stand-in virtualenv plays Python (its fetch writes into a
stand-in Maven repository over a few seconds), so the script itself runs, as bash, unchanged."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  "-m offset_ledger.devstack fetch")
    echo "[devstack] resolving spark-kafka from Maven Central into /cache (first run only)" >&2
    for i in 1 2 3 4 5 6; do head -c 1048576 /dev/zero > "$MAVEN_REPO/part$i.jar"; sleep 2; done ;;
  "-m offset_ledger.cli.demo"*) echo "demo ran: $*" ;;
  *) exit 0 ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_first_run_shows_what_it_downloads_and_how_far(tmp_path: Path) -> None:
    venv, tools, repo = tmp_path / "venv", tmp_path / "tools", tmp_path / "m2"
    (venv / "bin").mkdir(parents=True)
    tools.mkdir()
    repo.mkdir()
    _executable(venv / "bin" / "python", FAKE_PYTHON)
    for tool in ("java", "mvn"):
        _executable(tools / tool, "#!/bin/sh\nexit 0\n")
    env = {**os.environ, "OFFSET_LEDGER_VENV": str(venv), "MAVEN_REPO": str(repo),
           "PATH": f"{tools}:{os.environ['PATH']}"}
    r = subprocess.run([str(ROOT / "scripts" / "demo"), "--seconds", "5"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    progress = [line for line in r.stdout.splitlines() if line.startswith("   resolving spark-kafka: ")]
    assert progress and progress[-1].endswith("MB downloaded so far (about 185 MB on a first run)"), r.stdout
    assert int(progress[-1].split(": ")[1].split()[0]) >= 2  # it grows as the files arrive
    assert r.stdout.rstrip().endswith("demo ran: -m offset_ledger.cli.demo --seconds 5")
