"""The what-if's vLLM release (WhatIfQuestion.vllm_version, `memest estimate --vllm-version`):
G''s capture sizing, KV block size and 0.34's growable KV sizing come from that release's row
of memest.vllm_versions; unset is the installed release (0.33.0 here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.cli import main
from memest.errors import ConfigError
from memest.estimate.whatif import WhatIfQuestion, answer, grids
from memest.preflight.calibration import what_if_calibration
from memest.schema import RunReport
from memest.vllm_versions import installed_vllm_version, resolve_version

ROOT = Path(__file__).resolve().parents[3]
START = ROOT / "tests/data/starts/call11.W1_llama8b_s32_t4096.apply.report.rank0.json"
GIB, MIB = 1 << 30, 1 << 20
#: Llama-3-8B's KV bytes per token: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes (bf16).
PER_TOKEN = 32 * 8 * 128 * 2 * 2


def _ask(version: str | None, grid: dict[str, object] | None = None) -> object:
    report = RunReport.model_validate_json(START.read_text())
    question = WhatIfQuestion(grid=grid or {"max_num_seqs": 64}, vllm_version=version)
    return answer(report, question, calibration=what_if_calibration(report)).what_if


def test_unset_is_the_installed_release() -> None:
    got = _ask(None)
    assert got.vllm_version_to == (installed_vllm_version() or resolve_version().version)
    assert got.vllm_version_to == _ask("0.33.0").vllm_version_to


def test_each_release_sizes_the_grid_with_its_own_capture_rules() -> None:
    report = RunReport.model_validate_json(START.read_text())
    old = grids(report, {"max_num_seqs": 64}, resolve_version("0.33.0"))
    new = grids(report, {"max_num_seqs": 64}, resolve_version("0.34.0"))
    assert (old.plans[1].sizing, new.plans[1].sizing) == ("vllm-0.33.0", "seed")
    # plan input fields without "sizing" take the release's too
    fields = {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "sm100": False}
    assert grids(report, fields, resolve_version("0.34.0")).plans[1].sizing == "seed"


def test_a_034_grid_has_64_token_blocks() -> None:
    """The start (vLLM 0.33.0) had 16-token blocks, its release's default; on 0.34.0 the same
    backend takes 64, so G''s tokens are whole 64-token blocks of the same per-token bytes."""
    old, new = _ask("0.33.0"), _ask("0.34.0")
    assert old.kv_bytes_per_token_to == new.kv_bytes_per_token_to == PER_TOKEN
    assert old.kv_budget_bytes_to is not None and new.kv_budget_bytes_to is not None
    assert old.kv_tokens_to == old.kv_budget_bytes_to // (PER_TOKEN * 16) * 16
    assert new.kv_tokens_to == new.kv_budget_bytes_to // (PER_TOKEN * 64) * 64
    assert any("KV block size 16 -> 64" in n for n in new.notes)
    assert not any("KV block size" in n for n in old.notes)


def test_a_034_grid_predicts_the_growable_commit_beside_memests() -> None:
    """At utilization 1.0 the headroom binds both sizings, so they differ by their margins
    alone: vLLM's max(1 GiB, 0.75 x transient) against memest's 512 MiB non-torch reserve."""
    new = _ask("0.34.0")
    g = new.growable_kv_to
    assert g is not None and g.gpu_memory_utilization == 1.0
    terms = new.terms_to
    assert terms is not None
    assert g.transient_peak_bytes == terms.profile_peak_activation_bytes + terms.mla_context_bytes
    assert g.vllm_margin_bytes == max(GIB, int(0.75 * g.transient_peak_bytes))
    assert g.memest_margin_bytes == 512 * MIB
    assert g.memest_kv_bytes - g.vllm_kv_bytes == g.vllm_margin_bytes - g.memest_margin_bytes
    assert g.vllm_kv_tokens == g.vllm_kv_bytes // (PER_TOKEN * 64) * 64
    assert _ask("0.33.0").growable_kv_to is None
    # a grid that sets the utilization sizes the growable cache with it
    capped = _ask("0.34.0", {"max_num_seqs": 64, "gpu_memory_utilization": 0.8})
    assert capped.growable_kv_to is not None
    assert capped.growable_kv_to.gpu_memory_utilization == 0.8


def test_an_unsupported_release_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="vllm_version"):
        _ask("0.35.0")
    argv = ["estimate", "--from", str(START), "--grid", '{"max_num_seqs": 64}']
    assert main([*argv, "--vllm-version", "0.35.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vllm-version" in err[0] and "0.33.0, 0.34.0" in err[0]
    assert main([*argv, "--vllm-version", "0.34.0"]) == 0
    out = capsys.readouterr().out
    assert "(vLLM 0.34.0's rules)" in out and "At G': vLLM 0.34.0, growable KV cache" in out
