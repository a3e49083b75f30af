"""Is a process there? One answer for the spool's orphan check, the Kafka sink's producer owner (on
executors: the standard library only) and the devstack."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """True while ``pid`` names a process (one of another user's included: signalling it is refused, not
    missing). A zombie still counts: its parent has not reaped it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
