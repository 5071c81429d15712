"""vLLM 0.34's growable KV cache beside memest's terms (memest.estimate.growable.margin_use):
the margin vLLM kept, memest's need beyond what vLLM counted, and the margin left unused, on a
real 0.34 start (call 47) and on its sizing with a smaller counted transient, by hand."""

from __future__ import annotations

from pathlib import Path

from memest.estimate import account
from memest.estimate.growable import margin_use, transient_bytes
from memest.schema import RunReport

ROOT = Path(__file__).resolve().parents[3]
START = ROOT / "tests/data/starts/call47.A_llama8b_s128_t4096_udef.apply.report.rank0.json"
GIB, MIB = 1 << 30, 1 << 20


def _report() -> RunReport:
    return RunReport.model_validate_json(START.read_text())


def test_a_real_034_start_keeps_its_whole_margin_unused() -> None:
    """Call 47: vLLM measured a 432 MiB transient peak and torch grew its reservation by
    846 MiB over a sizing step, so it counted 887,095,296 B and kept a 1 GiB margin (its floor:
    0.75 x 432 MiB is less); memest's measured need, 622,854,144 B (the report's memest
    transient), is inside what vLLM counted, so none of the margin is needed."""
    acc = account(_report())
    g = acc.growable_kv
    assert g is not None and g.sized_by == "memest"
    assert g.committed_kv_bytes == 15720 * 8 * MIB  # committed blocks x 8 MiB pages
    assert g.vllm_transient_bytes == 887_095_296
    assert g.vllm_margin_bytes == GIB
    assert g.memest_need_bytes == 622_854_144
    assert g.memest_need_beyond_vllm_bytes == 0
    assert g.margin_unused_bytes == GIB


def test_need_beyond_what_vllm_counted_comes_out_of_the_margin() -> None:
    report = _report()
    assert report.vllm is not None and report.vllm.extensible_kv is not None
    sizing = report.vllm.extensible_kv.model_copy(
        update={"transient_peak_bytes": 100 * MIB, "torch_reserve_growth_bytes": 0}
    )
    terms = account(report).terms
    assert terms is not None
    g = margin_use(sizing, terms)
    assert g.memest_need_beyond_vllm_bytes == 622_854_144 - 100 * MIB
    assert g.margin_unused_bytes == GIB - (622_854_144 - 100 * MIB)
    short = margin_use(sizing.model_copy(update={"margin_bytes": 256 * MIB}), terms)
    assert short.margin_unused_bytes == 256 * MIB - (622_854_144 - 100 * MIB)  # < 0: short
    assert short.margin_unused_bytes < 0
    assert transient_bytes(terms) == terms.profile_peak_activation_bytes + terms.mla_context_bytes


def test_without_terms_the_need_is_unknown_and_a_033_start_has_none() -> None:
    report = _report()
    assert report.vllm is not None and report.vllm.extensible_kv is not None
    g = margin_use(report.vllm.extensible_kv, None)
    assert (g.memest_need_bytes, g.margin_unused_bytes) == (None, None)
    assert g.vllm_margin_bytes == GIB
    old = RunReport.model_validate_json(
        (ROOT / "tests/data/starts/call11.W1_llama8b_s32_t4096.apply.report.rank0.json").read_text()
    )
    assert account(old).growable_kv is None
