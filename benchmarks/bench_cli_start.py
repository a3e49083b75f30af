"""How long a read command takes from `python` to its answer (issue 34 item 12), against a baseline.

    python benchmarks/bench_cli_start.py [--runs 7] [--baseline /path/to/other/checkout]

Seeds a SQLite ledger the way the listener writes (tests/ops_seed.py), then runs `pipelines --no-lag`,
`offsets`, `history` and `verify` in fresh interpreters, ``--runs`` times each, and prints the median
and the fastest wall time per command for this checkout and, with ``--baseline``, for another one
(the same commands, the same ledger). The goal is < 0.3 s on a quiet machine; a loaded machine
(shared CI cores) shows more, so compare the two columns of one run, not runs of different days.
Each cell also gives the CPU time the process used (user + system, median): on a quiet machine a
start is CPU-bound and its wall time is about that, and it moves far less with other load. The
two checkouts alternate run by run, so both see the same load.
``--importtime`` adds the ten slowest imports of `offsets` (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["pipelines", "--no-lag"], ["offsets", "orders"], ["history", "orders", "--limit", "5"],
            ["verify", "orders"])
RUN = "import sys; from offset_ledger.cli.main import main; main(sys.argv[1:])"
# What no read command can start without: the interpreter, Typer with the pydantic it coerces every
# parameter through, and SQLAlchemy with its SQLite dialect. The figure the lazy imports approach.
FLOOR = "import typer, typer._adapters, sqlalchemy, sqlalchemy.dialects.sqlite"


def _seed(dsn: str) -> None:
    sys.path.insert(0, str(ROOT))
    from offset_ledger.ledger.engine import make_engine, upgrade
    from tests.ops_seed import seed_pipeline

    engine = make_engine(dsn)
    upgrade(engine)
    seed_pipeline(engine, "orders", {"orders": {0: 1000, 1: 1000}, "payments": {0: 500}}, n_batches=20)
    engine.dispose()


def _once(checkout: Path, argv: list[str], dsn: str, code: str = RUN) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh interpreter running ``argv``."""
    env = {"PYTHONPATH": str(checkout), "OFFSET_LEDGER_DSN": dsn, "PATH": "/usr/bin:/bin"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # cwd: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH; run from
    # elsewhere, a baseline would import this checkout's package instead of its own.
    done = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True,
                          cwd=checkout)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 6):
        raise SystemExit(f"{' '.join(argv)} failed in {checkout}: {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cell(samples: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    return f"{statistics.median(walls):.3f} / {min(walls):.3f} s (cpu {statistics.median(cpus):.3f} s)"


def _slowest_imports(checkout: Path, dsn: str) -> list[str]:
    env = {"PYTHONPATH": str(checkout), "OFFSET_LEDGER_DSN": dsn, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN, "offsets", "orders"], env=env,
                          capture_output=True, text=True, cwd=checkout)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    top = [r for r in rows if not r[1].startswith("   ")]  # top-level imports: their cumulative time
    return [f"{us / 1000:7.1f} ms  {name.strip()}" for us, name in sorted(top, reverse=True)[:10]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with (e.g. the main branch)")
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dsn = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        _seed(dsn)
        head = f"{'command':<20} {'this checkout: median / min wall (cpu)':>40}"
        if args.baseline:
            head += f" {'baseline: median / min wall (cpu)':>40}"
        print(head)
        for argv in COMMANDS:
            mine: list[tuple[float, float]] = []
            base: list[tuple[float, float]] = []
            for _ in range(args.runs):  # alternate, so that both see the same load
                mine.append(_once(ROOT, argv, dsn))
                if args.baseline:
                    base.append(_once(args.baseline, argv, dsn))
            line = f"{' '.join(argv[:2]):<20} {_cell(mine):>40}"
            if args.baseline:
                line += f" {_cell(base):>40}"
            print(line, flush=True)
        floor = [_once(ROOT, [], dsn, FLOOR) for _ in range(args.runs)]
        print(f"{'floor (imports only)':<20} {_cell(floor):>40}  python + typer/pydantic + sqlalchemy/sqlite")
        if args.importtime:
            print("\nslowest top-level imports of `offsets` (cumulative):")
            print("\n".join(_slowest_imports(ROOT, dsn)))


if __name__ == "__main__":
    main()
