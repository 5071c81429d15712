"""reports.metric_rows; reports.run_id ON DELETE CASCADE

Each report's /metrics samples, computed at ingest, so that a scrape reads small rows instead of
parsing reports (left NULL here for stored reports: their samples are computed when needed).
A run's reports now go with it at the database, so a DELETE racing a POST to the same run can
never leave a report without its run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_FK = "fk_reports_run_id_runs"
#: Names the foreign key 0001 created unnamed when SQLite's table is copied (batch mode), so
#: that it can be dropped by name there; PostgreSQL named it itself.
_NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def _old_fk_name(conn: sa.Connection) -> str:
    for fk in sa.inspect(conn).get_foreign_keys("reports"):
        if fk["referred_table"] == "runs" and fk.get("name"):
            return str(fk["name"])
    return _FK


def upgrade() -> None:
    old = _old_fk_name(op.get_bind())
    # batch mode: SQLite cannot alter a constraint in place, so the table is copied there.
    with op.batch_alter_table("reports", naming_convention=_NAMING) as batch:
        batch.add_column(sa.Column("metric_rows", sa.Text(), nullable=True))
        batch.drop_constraint(old, type_="foreignkey")
        batch.create_foreign_key(_FK, "runs", ["run_id"], ["run_id"], ondelete="CASCADE")


def downgrade() -> None:
    with op.batch_alter_table("reports", naming_convention=_NAMING) as batch:
        batch.drop_constraint(_FK, type_="foreignkey")
        batch.create_foreign_key("reports_run_id_fkey", "runs", ["run_id"], ["run_id"])
        batch.drop_column("metric_rows")
