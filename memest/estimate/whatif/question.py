"""The what-if's one typed entry point: a question on a start in, an answer out.

The CLI (``memest estimate --grid``), the service (POST /api/v1/runs/{id}/estimate and
POST /api/v1/what-if) and the lab ask through :func:`answer`; the calibration comes in as an
argument (memest.preflight.calibration.what_if_calibration gives the shipped one).
"""

from __future__ import annotations

from memest.estimate.inverse import inverse_answer, target_tokens
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.whatif.budget import term_rows, what_if
from memest.estimate.whatif.grid import is_overlay
from memest.estimate.whatif.models import WhatIfAnswer, WhatIfCalibration, WhatIfQuestion
from memest.schema import RunReport
from memest.snapshot.format import Snapshot
from memest.vllm_versions import resolve_version


def answer(
    report: RunReport,
    question: WhatIfQuestion,
    *,
    calibration: WhatIfCalibration,
    dims: ModelDims | None = None,
    snapshot: Snapshot | None = None,
    snapshot_source: str = "snapshot",
) -> WhatIfAnswer:
    """The what-if of ``question.grid`` on ``report`` and, when asked, the inverse answers.

    ``dims`` and ``snapshot`` are as :func:`memest.estimate.whatif.what_if` takes them. The
    inverse questions (kv_tokens, or concurrency x max_model_len) are answered under G'; for a
    grid written as changes, the largest max_num_seqs is searched with the same model dimensions,
    margin and calibration (no snapshot: each probe is a what-if of its own).

    G' follows the rules of ``question.vllm_version`` (memest.vllm_versions; unset: the
    installed release, else the newest): the inverse probes too.

    Raises:
        ConfigError: a field of the question is refused (named: ``grid.<field>``, ``kv_tokens``,
            ``concurrency``, ``vllm_version``).
        MemestError: the report or snapshot cannot be used.
    """
    release = resolve_version(question.vllm_version)
    tokens = target_tokens(report, question.kv_tokens, question.concurrency)
    result = what_if(
        report,
        question.grid,
        margin_bytes=question.margin_bytes,
        snapshot=snapshot,
        snapshot_source=snapshot_source,
        dims=dims,
        calibration=calibration,
        release=release,
    )
    inverse = None
    if tokens is not None:
        asked = (
            ("concurrency", question.concurrency)
            if question.concurrency is not None
            else ("kv_tokens", tokens)
        )
        inverse = inverse_answer(
            report,
            result,
            tokens,
            question.grid if is_overlay(question.grid) else None,
            lambda r, g: what_if(
                r,
                g,
                margin_bytes=question.margin_bytes,
                dims=dims,
                calibration=calibration,
                release=release,
            ),
            asked,
        )
    return WhatIfAnswer(
        what_if=result,
        terms=term_rows(result),
        kv_cache_memory_bytes_to=result.kv_budget_bytes_to,
        inverse=inverse,
    )
