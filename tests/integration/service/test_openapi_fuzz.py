"""Property-based run of every documented route (Schemathesis, from the OpenAPI): no 5xx.

Bounded (a few examples per operation) so the suite stays fast; writes carry the token so that
ingest is exercised past authentication.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from memest.service import create_app, db  # noqa: E402
from memest.service.app import load_demo  # noqa: E402
from memest.service.config import Settings  # noqa: E402
from tests.integration.service.conftest import TOKEN  # noqa: E402

_DIR = Path(tempfile.mkdtemp(prefix="memest-fuzz-"))
_APP = create_app(
    Settings(database_url=f"sqlite:///{_DIR / 'fuzz.db'}", write_token=TOKEN)  # type: ignore[arg-type]
)
db.upgrade(_APP.state.engine)
load_demo(_APP)

# The coverage phase enumerates boundary cases regardless of max_examples and takes minutes on
# the RunReport body; the examples and fuzzing phases are what this bounded run keeps.
_CONFIG = schemathesis.config.SchemathesisConfig.from_str(
    "[phases.coverage]\nenabled = false\n[phases.stateful]\nenabled = false\n"
)
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP, config=_CONFIG)


def _check(case: schemathesis.Case) -> None:
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
    )


_FAST = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}


@schema.include(method="GET").parametrize()
@settings(max_examples=25, **_FAST)  # type: ignore[arg-type]
def test_reads_never_5xx(case: schemathesis.Case) -> None:
    _check(case)


# A RunReport body is large to generate; fewer examples keep the suite within its time budget.
@schema.include(method="POST").parametrize()
@settings(max_examples=25, **_FAST)  # type: ignore[arg-type]
def test_writes_and_calculators_never_5xx(case: schemathesis.Case) -> None:
    _check(case)
