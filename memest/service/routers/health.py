"""GET /healthz and GET /metrics."""

from __future__ import annotations

import gzip

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from memest.service.deps import MetricsDep, ReadAuth, SessionDep
from memest.service.metrics_cache import MetricsCache

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}},
)
def healthz(session: SessionDep) -> dict[str, str]:
    """Liveness and database reachability (always open, no token)."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get(
    "/metrics",
    dependencies=[ReadAuth],
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {
                "text/plain": {
                    "example": 'memest_graph_pool_bytes{model="nvidia/MiniMax-M3-NVFP4",'
                    'build="PR",stage="target.full",owner="moe_workspace"} 6.039797760e+08\n'
                }
            },
        }
    },
)
def metrics(service_metrics: MetricsDep, request: Request) -> Response:
    """Prometheus metrics: memest_graph_pool_bytes{model,build,stage,owner},
    memest_graph_pool_total_bytes, memest_kv_tokens, memest_kv_cache_bytes, memest_non_kv_bytes,
    memest_estimator_error_bytes{estimator} (newest run per model and build, from its accounting) and memest_ingest_reports_total{outcome}."""
    cache: MetricsCache = request.app.state.metrics_cache
    text = generate_latest(service_metrics.registry) + cache.exposition()
    if not _accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(text, media_type=CONTENT_TYPE_LATEST)
    # Prometheus asks for gzip: a fleet's 12 MB of text is about 0.3 MB compressed, for about
    # 40 ms of compression per scrape.
    return Response(
        gzip.compress(text, mtime=0),
        media_type=CONTENT_TYPE_LATEST,
        headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
    )


def _accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (named, or "*", without q=0)."""
    for part in header.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip().removeprefix("q=").strip() if "q=" in params else "1"
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False
