"""The console's browser tests, round after round, with the CPU taken by busy processes beside them.

A browser test that only passes on a quiet machine blocks a good submission on the next loaded one
(issue 38: a click landed on a control a refresh had just moved). This runs both browser test files
``OFFSET_LEDGER_BROWSER_ROUNDS`` times (2 in ``./scripts/test --long``; 20 for the full check:
``OFFSET_LEDGER_BROWSER_ROUNDS=20 ./scripts/test --long -k browser_loop``) in one pytest process,
so one Spark session serves every round and each round records its own ledger, while busy
processes (``OFFSET_LEDGER_BROWSER_HOGS``, one per core by default) compete for the CPU. Every round
must pass. A round takes about two minutes on two loaded cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from offset_ledger import devstack

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
FILES = ["tests/integration/test_console.py", "tests/integration/test_console_verify.py"]
# A busy loop that ends by itself: a hog left behind by a killed test run must not outlive it long.
HOG = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end:\n    pass\n"


def test_the_browser_tests_pass_round_after_round_on_a_busy_machine(stack: devstack.StackInfo) -> None:
    rounds = int(os.environ.get("OFFSET_LEDGER_BROWSER_ROUNDS", "2"))
    n_hogs = int(os.environ.get("OFFSET_LEDGER_BROWSER_HOGS", str(os.cpu_count() or 2)))
    assert rounds >= 1 and n_hogs >= 0, "OFFSET_LEDGER_BROWSER_ROUNDS >= 1 and OFFSET_LEDGER_BROWSER_HOGS >= 0"
    env = {**os.environ, **stack.env()}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL)
            for _ in range(n_hogs)]
    try:
        with tempfile.TemporaryDirectory(prefix="offset-ledger-loop-") as shots:
            env["OFFSET_LEDGER_SCREENSHOT_DIR"] = shots  # the docs' screenshots stay as committed
            # --keep-duplicates: each listed copy of a file is collected again (its module fixtures,
            # the recorded ledger and the served console, start anew); the session's Spark is shared.
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--keep-duplicates",
                 "-m", "not long", *(FILES * rounds)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    tail = "\n".join(done.stdout.splitlines()[-40:])
    print(f"{rounds} round(s) of the browser tests beside {len(hogs)} busy process(es):\n{tail}")
    assert done.returncode == 0, f"stderr:\n{done.stderr[-4000:]}\nstdout:\n{tail}"
    summary = re.search(r"(\d+) passed", done.stdout)
    assert summary is not None and "failed" not in done.stdout.splitlines()[-1], tail
    per_round = int(summary.group(1)) / rounds
    assert per_round == int(per_round) and per_round >= 10, f"expected every round to run every test: {tail}"
