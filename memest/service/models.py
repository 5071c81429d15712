"""SQLAlchemy 2.0 tables: runs and their per-rank reports (the report JSON is stored verbatim),
and the login form's sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One vLLM start (all ranks); metadata from its first report, checked against later ones."""

    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    model: Mapped[str] = mapped_column(String(300), index=True)
    build_label: Mapped[str] = mapped_column(String(200), index=True, default="")
    vllm_commit: Mapped[str | None] = mapped_column(String(64), index=True)
    vllm_version: Mapped[str | None] = mapped_column(String(64))
    gpu_name: Mapped[str | None] = mapped_column(String(200), index=True)
    source: Mapped[str] = mapped_column(String(32))
    world_size: Mapped[int] = mapped_column(Integer)
    #: The lead report's configuration fingerprint (memest.reporters.views.fingerprint), as the
    #: history page shows it; None only where it could not be stored (read from the report then).
    config_fingerprint: Mapped[str | None] = mapped_column(String(200), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    #: Indexed: /metrics reads the newest, and the runs ingested since its last scrape.
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)

    reports: Mapped[list[Report]] = relationship(back_populates="run", order_by="Report.rank")


class Report(Base):
    """One rank's RunReport; ``payload`` is its canonical JSON, ``payload_sha256`` its digest."""

    __tablename__ = "reports"
    __table_args__ = (UniqueConstraint("run_id", "rank", name="uq_reports_run_rank"),)

    report_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    schema_version: Mapped[str] = mapped_column(String(16))
    payload: Mapped[str] = mapped_column(Text)
    payload_sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(Integer)
    graph_pool_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_tokens: Mapped[int | None] = mapped_column(BigInteger)
    #: The report's /metrics samples as JSON (memest.service.metrics_cache), computed at ingest;
    #: None for a report stored before they were (its samples are then computed when needed).
    metric_rows: Mapped[str | None] = mapped_column(Text, deferred=True)
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    run: Mapped[Run] = relationship(back_populates="reports")


class LoginSession(Base):
    """A browser's login (the /login form): only the SHA-256 of its random id is stored, so a
    copy of the database cannot be replayed as a cookie; logout deletes the row."""

    __tablename__ = "sessions"

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: Which token opened it (memest.service.sessions.token_tag): changing that token ends it.
    token_tag: Mapped[str] = mapped_column(String(64))
    #: Unix seconds (integers compare the same on every backend, with no time zone to lose).
    created_at_s: Mapped[int] = mapped_column(BigInteger)
    expires_at_s: Mapped[int] = mapped_column(BigInteger, index=True)
