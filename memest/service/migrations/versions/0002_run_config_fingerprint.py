"""runs.config_fingerprint

The lead report's configuration fingerprint on each run, so /metrics groups runs by
(model, build, configuration) without parsing every report; filled from each run's stored lead
report (its lowest rank).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_runs = sa.table("runs", sa.column("run_id", sa.String), sa.column("config_fingerprint", sa.String))
_reports = sa.table(
    "reports", sa.column("run_id", sa.String), sa.column("rank", sa.Integer), sa.column("payload")
)


def upgrade() -> None:
    op.add_column("runs", sa.Column("config_fingerprint", sa.String(200), nullable=True))
    op.create_index("ix_runs_config_fingerprint", "runs", ["config_fingerprint"])
    _backfill(op.get_bind())


def _backfill(conn: sa.Connection) -> None:
    """Each run's fingerprint from its lead report, one report in memory at a time; a payload
    that no longer reads as a RunReport leaves it None (readers then take it from the report)."""
    from memest.schema import RunReport
    from memest.service.store import run_fingerprint

    leads = conn.execute(
        sa.select(_reports.c.run_id, sa.func.min(_reports.c.rank)).group_by(_reports.c.run_id)
    ).all()
    for run_id, rank in leads:
        payload = conn.execute(
            sa.select(_reports.c.payload).where(
                _reports.c.run_id == run_id, _reports.c.rank == rank
            )
        ).scalar_one()
        try:
            report = RunReport.model_validate_json(payload)
        except ValueError:
            continue
        conn.execute(
            sa.update(_runs)
            .where(_runs.c.run_id == run_id)
            .values(config_fingerprint=run_fingerprint(report))
        )


def downgrade() -> None:
    op.drop_index("ix_runs_config_fingerprint", table_name="runs")
    op.drop_column("runs", "config_fingerprint")
