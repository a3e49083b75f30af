"""``import-checkpoint PIPELINE CHECKPOINT`` and ``watch PIPELINE CHECKPOINT``: the pipeline is
positional, as in every other command.

The old spelling ``COMMAND CHECKPOINT --pipeline PIPELINE`` still works (a hidden, deprecated option
that says so on stderr); giving the pipeline twice, differently, is a usage error.
"""

from __future__ import annotations

from typing import Optional

import typer

from offset_ledger.errors import InvalidInput


def pipeline_and_checkpoint(first: Optional[str], second: Optional[str], pipeline_option: Optional[str],
                            command: str = "import-checkpoint") -> tuple[str, str]:
    """(pipeline, checkpoint) from the two positional arguments and the deprecated ``--pipeline``."""
    if pipeline_option is not None:
        typer.echo("offset-ledger: note: --pipeline is deprecated; give the pipeline first: "
                   f"{command} PIPELINE CHECKPOINT", err=True)
        if second is None:  # the old spelling: CHECKPOINT --pipeline PIPELINE
            if first is None:
                raise InvalidInput(f"missing argument CHECKPOINT ({command} PIPELINE CHECKPOINT)")
            return pipeline_option, first
        if first != pipeline_option:
            raise InvalidInput(f"the pipeline is given twice, differently: {first!r} and --pipeline "
                               f"{pipeline_option!r}")
        return first, second
    if first is None or second is None:
        missing = "PIPELINE and CHECKPOINT" if first is None else "CHECKPOINT"
        raise InvalidInput(f"missing argument {missing} ({command} PIPELINE CHECKPOINT)")
    return first, second
