"""Without PySpark: the package, the CLI, the API and start_from_ledger work; the listener says what to install.

Each check runs in a fresh interpreter in which PySpark cannot be imported (a ``sitecustomize``
puts ``None`` in ``sys.modules['pyspark']``, which makes ``import pyspark`` raise ImportError),
as on a machine that only runs the service or the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCK = "import sys\nsys.modules['pyspark'] = None  # as if PySpark were not installed\n"


@pytest.fixture
def no_pyspark_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    env["OFFSET_LEDGER_HOME"] = str(tmp_path / "home")
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_pyspark_is_really_unimportable_there(no_pyspark_env: dict[str, str]) -> None:
    # Guards the other tests: if the block stopped working they would pass for the wrong reason.
    out = _python("import pyspark", no_pyspark_env)
    assert out.returncode != 0 and "None in sys.modules" in out.stderr


def test_package_resolver_and_api_import_without_pyspark(no_pyspark_env: dict[str, str]) -> None:
    code = (
        "import offset_ledger\n"
        "from offset_ledger import RestartPlan, start_from_ledger\n"
        "from offset_ledger.api.app import create_app\n"
        "import offset_ledger.cli.main, offset_ledger.operate.operations, offset_ledger.rules.resolver\n"
        "assert callable(start_from_ledger) and callable(create_app)\n"
        "print(sorted(offset_ledger.__all__))\n"
    )
    out = _python(code, no_pyspark_env)
    assert out.returncode == 0, out.stderr
    assert "start_from_ledger" in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["resolve", "--help"], ["serve", "--help"]])
def test_cli_help_without_pyspark(no_pyspark_env: dict[str, str], argv: list[str]) -> None:
    script = Path(sys.executable).with_name("offset-ledger")
    cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]
    out = subprocess.run([*cmd, *argv], capture_output=True, text=True, env=no_pyspark_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout and "Traceback" not in out.stderr


def test_the_listener_import_names_the_fix(no_pyspark_env: dict[str, str]) -> None:
    code = (
        "try:\n"
        "    from offset_ledger import OffsetLedgerListener\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, '|', exc, '|', exc.name, '|', exc.__cause__, exc.__suppress_context__)\n"
        "else:\n"
        "    raise SystemExit('imported without PySpark')\n"
    )
    out = _python(code, no_pyspark_env)
    assert out.returncode == 0, out.stderr
    kind, message, name, chain = (part.strip() for part in out.stdout.split("|"))
    assert kind == "ModuleNotFoundError" and name == "pyspark"
    assert "[spark]'" in message and "pip install '" in message and "platform's PySpark" in message
    assert chain == "None True"  # one error, not a chain of two


def test_pyspark_is_an_extra_and_the_service_image_installs_none() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[3]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert not any(dep.lower().startswith("pyspark") for dep in project["dependencies"])
    assert project["optional-dependencies"]["spark"] == ["pyspark>=3.5,<4.3"]
    installs = [line for line in (root / "Dockerfile").read_text().splitlines() if line.startswith("RUN") and "pip install" in line]
    assert installs and not any("spark" in line or "pyspark" in line for line in installs)
