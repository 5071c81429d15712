"""runs and reports

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(200), primary_key=True),
        sa.Column("model", sa.String(300), nullable=False),
        sa.Column("build_label", sa.String(200), nullable=False),
        sa.Column("vllm_commit", sa.String(64), nullable=True),
        sa.Column("vllm_version", sa.String(64), nullable=True),
        sa.Column("gpu_name", sa.String(200), nullable=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_runs_model", "runs", ["model"])
    op.create_index("ix_runs_build_label", "runs", ["build_label"])
    op.create_index("ix_runs_vllm_commit", "runs", ["vllm_commit"])
    op.create_index("ix_runs_gpu_name", "runs", ["gpu_name"])
    op.create_index("ix_runs_created_at", "runs", ["created_at"])
    op.create_table(
        "reports",
        sa.Column("report_id", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(200), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("schema_version", sa.String(16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("graph_pool_bytes", sa.BigInteger(), nullable=True),
        sa.Column("kv_tokens", sa.BigInteger(), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("run_id", "rank", name="uq_reports_run_rank"),
    )
    op.create_index("ix_reports_run_id", "reports", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_reports_run_id", table_name="reports")
    op.drop_table("reports")
    for col in ("created_at", "gpu_name", "vllm_commit", "build_label", "model"):
        op.drop_index(f"ix_runs_{col}", table_name="runs")
    op.drop_table("runs")
