"""Pruned islands keep the evidence: ``pruned_ranges`` records reads, unknown starts and time span.

Revision ID: 0014
Revises: 0009
Create Date: 2026-11-26

0009's islands only *explained* the gaps a prune left, and folded a first batch's unreported start
into its end; verify then started its sweep at the first kept range, so (issue 33, case 5) a hole
older than it vanished, a pruned first batch with no reported start became a false gap, and a
stretch read twice by a pruned batch and a kept one read once. From 0014 an island stands for its
reads: verify sweeps it as history. Added columns:

- ``counts_reads``: the island stands for its reads (every island prune records from now on);
- ``first_until_offset``: where the island's first batch ended, so an unknown start (``from_offset``
  now NULL, as in ``batch_offsets``) is given back to verify as that batch's own row;
- ``last_batch_time``: the island's last batch, so a restart's "where did the history stand" can
  count the islands before it;
- ``run_id``: the run that read it (an island never spans two runs), so a finding that flags the
  run (a zombie, a run on a foreign checkpoint) still accounts for its pruned extra reads.

Existing islands, converted where the data allows: an island that does not begin with its query's
first batch (``from_batch_id > 0``: Spark reports every later batch's start) and whose query ran no
run a finding flags (a zombie's or foreign run's extra reads were explained by that flag, which a
pruned batch no longer carries) counts its reads from now on. The rest cannot be converted (0009
did not record whether the first start was reported, nor which run read the island) and keep 0009's
meaning: they explain the gaps they cover; ``last_batch_time`` stays empty. ``pruned_ranges`` is
small (a row per island) and not written by the listener: the update locks no hot table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0012"
branch_labels = None
depends_on = None

# rules.verify.RUN_FINDINGS as released with 0014 (spelled out: this revision never changes).
_RUN_FINDINGS = ("foreign_run", "regression", "pending_reset", "shared_position", "reset_overtaken")


def upgrade() -> None:
    bind = op.get_bind()
    columns = {c["name"]: c for c in sa.inspect(bind).get_columns("pruned_ranges")}
    if "counts_reads" not in columns:
        # 0001 builds its tables from the live tables module: a new ledger has these columns already.
        with op.batch_alter_table("pruned_ranges") as batch:
            batch.add_column(sa.Column("counts_reads", sa.Boolean(), nullable=False, server_default=sa.false()))
            batch.add_column(sa.Column("first_until_offset", sa.BigInteger(), nullable=True))
            batch.add_column(sa.Column("last_batch_time", sa.DateTime(timezone=True), nullable=True))
            batch.add_column(sa.Column("run_id", sa.String(64), nullable=True))
            batch.alter_column("from_offset", existing_type=sa.BigInteger(), nullable=True)
    kinds = ", ".join(f"'{k}'" for k in _RUN_FINDINGS)
    op.execute(sa.text(
        "UPDATE pruned_ranges SET counts_reads = :yes WHERE counts_reads = :no AND from_batch_id > 0 "
        "AND NOT EXISTS (SELECT 1 FROM runs r JOIN findings f ON f.run_id = r.run_id "
        f"WHERE r.query_id = pruned_ranges.query_id AND f.kind IN ({kinds}))"
    ).bindparams(sa.bindparam("yes", True, sa.Boolean()), sa.bindparam("no", False, sa.Boolean())))


def downgrade() -> None:
    # 0009's shape: an unknown start folded into the first batch's end (what 0009 recorded).
    op.execute("UPDATE pruned_ranges SET from_offset = first_until_offset WHERE from_offset IS NULL")
    op.execute("UPDATE pruned_ranges SET from_offset = until_offset WHERE from_offset IS NULL")
    with op.batch_alter_table("pruned_ranges") as batch:
        batch.alter_column("from_offset", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_column("run_id")
        batch.drop_column("last_batch_time")
        batch.drop_column("first_until_offset")
        batch.drop_column("counts_reads")
