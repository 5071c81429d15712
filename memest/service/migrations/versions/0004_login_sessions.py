"""sessions: server-side login sessions

The /login form's cookie was derived from the token, so logging out revoked nothing; each login
is now a row (its random id stored hashed, with an expiry) that /logout deletes. Every replica
on the database sees the same rows.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("token_tag", sa.String(64), nullable=False),
        sa.Column("created_at_s", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_s", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_sessions_expires_at_s", "sessions", ["expires_at_s"])


def downgrade() -> None:
    op.drop_index("ix_sessions_expires_at_s", table_name="sessions")
    op.drop_table("sessions")
