"""The package as users get it: the wheel built from this checkout, installed in a fresh virtualenv
outside the repository next to the PySpark 3.5 a cluster already has, upgrades a ledger and answers
``--help`` — the migrations come from the installed wheel, not from the checkout."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_PYSPARK = "3.5.7"  # what a Spark 3.5 cluster's Python already has; the install must keep it

pytestmark = [pytest.mark.integration, pytest.mark.long]  # builds and installs a wheel: ./scripts/test --long


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout


def test_the_built_wheel_installs_and_upgrades_outside_the_repo(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)], tmp_path)
    (wheel,) = wheels.glob("offset_ledger-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    work = tmp_path / "elsewhere"
    work.mkdir()
    _run([str(python), "-m", "pip", "install", "-q", f"pyspark=={CLUSTER_PYSPARK}"], work)
    _run([str(python), "-m", "pip", "install", "-q", f"{wheel}[spark]"], work)

    versions = _run([str(python), "-c", "import pyspark, offset_ledger.ledger.engine as e; "
                     "print(pyspark.__version__); print(e.migrations_dir())"], work).split()
    assert versions[0] == CLUSTER_PYSPARK  # [spark] did not replace the cluster's PySpark
    assert str(env_dir) in versions[1] and str(ROOT) not in versions[1]  # the wheel's own migrations

    cli = env_dir / "bin" / "offset-ledger"
    assert "Usage: offset-ledger" in _run([str(cli), "--help"], work)
    dsn = f"sqlite:///{work / 'ledger.db'}"
    _run([str(cli), "db", "upgrade", "--dsn", dsn], work)
    newest = max(p.name.split("_")[0] for p in (ROOT / "migrations" / "versions").glob("0*.py"))
    current = _run([str(python), "-c", "from offset_ledger.ledger.engine import current_revision, make_engine; "
                    f"print(current_revision(make_engine({dsn!r}, create=False)))"], work)
    assert current.strip().startswith(newest)
