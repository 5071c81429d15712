"""runs.ingested_at indexed

Every /metrics scrape reads the newest ingest time, and after an ingest the runs ingested since
the last scrape (a range on ingested_at): both were full scans of the runs table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_ingested_at", "runs", ["ingested_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_ingested_at", table_name="runs")
