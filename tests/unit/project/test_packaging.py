"""What an install without the [server] extra gets: the listener, the restart and the CLI, with no
web stack imported, and a one-line hint from ``serve``; the metadata matches the LICENSE file."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVER = ("fastapi", "starlette", "uvicorn", "jinja2")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_listener_restart_and_cli_import_no_web_stack(tmp_path: Path) -> None:
    code = ("import sys\nimport offset_ledger.capture.listener, offset_ledger.operate.restart, offset_ledger.cli.main\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER!r})))\n")
    out = _python(code, dict(os.environ, OFFSET_LEDGER_HOME=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_serve_without_the_server_extra_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nfor m in ('uvicorn', 'fastapi', 'starlette', 'jinja2'):\n    sys.modules[m] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OFFSET_LEDGER_HOME=str(tmp_path / "home"))
    out = _python("from offset_ledger.cli.main import main; main(['serve'])", env)
    assert out.returncode == 2
    assert out.stderr.strip().endswith(f"pip install '{ROOT}[server]'") and out.stderr.count("\n") == 1


def test_license_and_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    extras = project["optional-dependencies"]
    assert not any(dep.split(">")[0].split("<")[0] in SERVER for dep in project["dependencies"])
    assert {dep.split(">")[0] for dep in extras["server"]} >= {"fastapi", "uvicorn", "jinja2"}
    assert "offset-ledger[server]" in extras["test"]  # ./scripts/test and .ci/run install .[test,spark]
    # [spark] stops below the next minor of the newest PySpark the tests run (constraints.txt).
    pinned = next(line.split("==")[1] for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if line.startswith("pyspark=="))
    major, minor = (int(x) for x in pinned.split(".")[:2])
    assert extras["spark"] == [f"pyspark>=3.5,<{major}.{minor + 1}"]


def test_the_wheel_lists_every_folder_of_the_package() -> None:
    """``packages`` is a list (the migrations are mapped in from the top level): a new folder is added to it."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(d.relative_to(ROOT).parts) for d in (ROOT / "offset_ledger").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and "-" not in str(d.relative_to(ROOT))}
    listed = set(setuptools["packages"])
    assert listed - {"offset_ledger", "offset_ledger.migrations", "offset_ledger.migrations.versions"} == folders
    assert setuptools["package-dir"] == {"offset_ledger.migrations": "migrations",
                                         "offset_ledger.migrations.versions": "migrations/versions"}
    assert (ROOT / "migrations" / "env.py").is_file() and not (ROOT / "offset_ledger" / "migrations").exists()
