"""How long a read command takes from `python` to its answer (issue 34 item 12), against a baseline.

    python benchmarks/bench_cli_start.py [--runs 7] [--baseline /path/to/other/checkout]

Seeds a SQLite ledger the way the listener writes (tests/ops_seed.py), then runs `pipelines --no-lag`,
`offsets`, `history` and `verify` in fresh interpreters, ``--runs`` times each, and prints the median
and the fastest wall time per command for this checkout and, with ``--baseline``, for another one
(the same commands, the same ledger). The goal is < 0.3 s on a quiet machine; a loaded machine
(shared CI cores) shows more, so compare the two columns of one run, not runs of different days.
``--importtime`` adds the ten slowest imports of `offsets` (``python -X importtime``).
"""

from __future__ import annotations

import argparse
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


def _seed(dsn: str) -> None:
    sys.path.insert(0, str(ROOT))
    from offset_ledger.ledger.engine import make_engine, upgrade
    from tests.ops_seed import seed_pipeline

    engine = make_engine(dsn)
    upgrade(engine)
    seed_pipeline(engine, "orders", {"orders": {0: 1000, 1: 1000}, "payments": {0: 500}}, n_batches=20)
    engine.dispose()


def _times(checkout: Path, argv: list[str], dsn: str, runs: int) -> list[float]:
    env = {"PYTHONPATH": str(checkout), "OFFSET_LEDGER_DSN": dsn, "PATH": "/usr/bin:/bin"}
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", RUN, *argv], env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - started)
        if done.returncode not in (0, 6):
            raise SystemExit(f"{' '.join(argv)} failed in {checkout}: {done.stderr.strip()}")
    return out


def _slowest_imports(checkout: Path, dsn: str) -> list[str]:
    env = {"PYTHONPATH": str(checkout), "OFFSET_LEDGER_DSN": dsn, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN, "offsets", "orders"], env=env,
                          capture_output=True, text=True)
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
        head = f"{'command':<24} {'this checkout (median / min)':>30}"
        if args.baseline:
            head += f" {'baseline (median / min)':>26}"
        print(head)
        for argv in COMMANDS:
            mine = _times(ROOT, argv, dsn, args.runs)
            line = f"{' '.join(argv[:2]):<24} {statistics.median(mine):>20.3f} s / {min(mine):.3f} s"
            if args.baseline:
                base = _times(args.baseline, argv, dsn, args.runs)
                line += f" {statistics.median(base):>16.3f} s / {min(base):.3f} s"
            print(line, flush=True)
        if args.importtime:
            print("\nslowest top-level imports of `offsets` (cumulative):")
            print("\n".join(_slowest_imports(ROOT, dsn)))


if __name__ == "__main__":
    main()
