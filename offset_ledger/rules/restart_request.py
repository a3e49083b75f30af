"""Pure: ``RestartRequest``, everything one restart is asked to do, as one value.

``start_from_ledger(...)`` and ``Pipeline.plan``/``start`` build it from what their callers gave
(the pipeline and its group, the restart's options, the policies given for the call, the names of
the job's sinks) and hand it to the one verb, ``operate.restart.restart(ops, request)``. Where the
ledger and the cluster are is no part of it: those are addresses (``offset_ledger.addresses``), the
context the verb runs in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offset_ledger.errors import ConfigError
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions


@dataclass(frozen=True)
class RestartRequest:
    """One restart, asked: which pipeline, with which options and policies, writing with which sinks.

    ``given``: the policies the call gave (None: not given; the stored ones, then the defaults
    apply: ``Policies.over``). ``sinks``: the names of the sinks the job writes with (None: every
    sink that committed since the last deliberate start); each is judged on its own commits
    (``rules.sink_ahead.sink_plan``). A restart writes a generation under ``checkpoint_root``: a
    request without one is refused when built (a read-only plan takes ``RestartOptions`` alone).
    """

    ref: PipelineRef
    options: RestartOptions
    given: Policies = field(default_factory=Policies)
    sinks: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.options.checkpoint_root is None:
            raise ConfigError("checkpoint_root is required")
        if self.sinks is not None:
            object.__setattr__(self, "sinks", tuple(self.sinks))

    @property
    def pipeline(self) -> str:
        return self.ref.pipeline

    @property
    def window_asked(self) -> bool:
        """The call asked for a stateful rewind (``window=``); a stored window applies only on an upgrade."""
        return self.given.window is not None
