"""lab/preflight_check.py on committed start records (reports/vllm/raw/results.call*.jsonl).

The expectations come from the raw records read here and from ``memest preflight`` run through
its CLI with the configuration's flags, never from the script's own arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab import preflight_check as pc
from memest.cli import main as memest_main
from memest.preflight import preflight
from memest.preflight.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "reports/vllm/raw"
CALL8 = RAW / "results.call8.jsonl"  # E (EAGLE3 K=5): apply and vLLM alone, step figures
CALL6 = RAW / "results.call6.jsonl"  # B, C, D: apply and plan, step figures
CALL4 = RAW / "results.call4.jsonl"  # B, C: no step figure (end of init)
CALL7 = RAW / "results.call7.jsonl"  # two starts that crashed (rc -11)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cli_budget(name: str, capsys: pytest.CaptureFixture[str]) -> int:
    """kv_budget_bytes of `memest preflight --json` with the flags vllm_runs.py starts with."""
    cfg = pc.CONFIGS[name]
    model = Path(cfg["model"]).name
    args = [
        "preflight",
        "--json",
        "--model-config",
        str(ROOT / "tests/data/configs" / f"{model}.json"),
        "--max-num-seqs",
        str(cfg["max_num_seqs"]),
        "--max-num-batched-tokens",
        str(cfg["mbt"]),
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        str(cfg["util"]),
        "--attention-backend",
        "TRITON_ATTN",
    ]
    if cfg.get("spec"):
        spec = json.loads(cfg["spec"])
        draft = ROOT / "tests/data/configs" / f"{Path(spec['model']).name}.json"
        args += ["--speculative-config", cfg["spec"], "--draft-model-config", str(draft)]
    capsys.readouterr()
    assert memest_main(args) == 0
    return int(json.loads(capsys.readouterr().out)["kv_budget_bytes"])


def test_truth_and_errors_follow_the_records(capsys: pytest.CaptureFixture[str]) -> None:
    c = pc.check([CALL8, CALL6])
    raw = {("results.call8.jsonl", n): r for n, r in enumerate(_records(CALL8), 1)}
    raw |= {("results.call6.jsonl", n): r for n, r in enumerate(_records(CALL6), 1)}
    assert len(c.rows) == len(raw)  # every record of these calls has kv_bytes and a step figure
    budgets = {name: _cli_budget(name, capsys) for name in {r.config for r in c.rows}}
    for row in c.rows:
        rec = raw[(row.source, row.line)]
        assert (row.config, row.mode) == (rec["config"], rec["mode"])
        assert row.truth_from == "step"
        # these calls ran no full-batch step: it is their full-size step plus the prompt-logprobs
        # chunk, 1,024 x 128,256 bf16 logits (250.5 MiB), which no freed block of a Llama-8B
        # forward holds (gate_up at 4,096 tokens: 224 MiB), so a segment rounded to 2 MiB
        chunk = 252 << 20
        usage = rec["step_usage_minus_budget_bytes"] + chunk
        assert row.truth_kv_bytes == rec["kv_bytes"] - usage
        assert row.predicted_kv_bytes == budgets[row.config]
        assert row.error_bytes == row.predicted_kv_bytes - row.truth_kv_bytes
        assert row.budget_matches and rec["budget_bytes"] > 0
        if rec["mode"] == "alone":
            assert row.vllm_kv_bytes == rec["kv_bytes"]
            assert row.vllm_error_bytes == usage
        else:
            assert row.vllm_kv_bytes is None and row.vllm_error_bytes is None
    assert any(r.mode == "alone" for r in c.rows)


def test_end_of_init_fallback_is_named() -> None:
    c = pc.check([CALL4])
    recs = _records(CALL4)
    assert all(r.get("step_usage_minus_budget_bytes") is None for r in recs)
    for row in c.rows:
        rec = recs[row.line - 1]
        assert row.truth_from == "end"
        assert row.truth_kv_bytes == rec["kv_bytes"] - rec["usage_minus_budget_bytes"]


def test_failed_starts_are_skipped_not_compared() -> None:
    c = pc.check([CALL7])
    recs = _records(CALL7)
    failed = [n for n, r in enumerate(recs, 1) if r.get("kv_bytes") is None]
    assert failed and sorted(r.line for r in c.rows) == [
        n for n in range(1, len(recs) + 1) if n not in failed
    ]
    assert len(c.skipped) == len(failed)


def test_unseen_flag_is_the_calibrations_architectures() -> None:
    shipped = load_calibration("h200")
    c = pc.check([CALL8])
    for row in c.rows:
        assert row.architecture_in_calibration == (
            row.architecture in shipped.measured_architectures
        )
    none_measured = shipped.model_copy(update={"measured_architectures": []})
    u = pc.check([CALL8], none_measured)
    assert all(not r.architecture_in_calibration for r in u.rows)
    # the flag widens the range, never moves the point prediction
    assert [r.predicted_kv_bytes for r in u.rows] == [r.predicted_kv_bytes for r in c.rows]
    assert all(
        a.predicted_uncertainty_bytes > b.predicted_uncertainty_bytes
        for a, b in zip(u.rows, c.rows, strict=True)
    )
    s = pc.summary(u.rows)
    assert s["unseen_architectures"] == sorted({r.architecture for r in u.rows})
    within = all(abs(r.error_bytes) <= 1 << 28 for r in u.rows)
    assert s["unseen_architectures_within_tolerance"] == (s["unseen_architectures"] * within)


def test_grid_in_calibration_from_its_starts(tmp_path: Path) -> None:
    """E's starts (call8) are calibration starts; W4 is A's grid with capture sizes capped at 64,
    a grid no calibration start ran."""
    cal = load_calibration("h200")
    e_report = json.loads(
        (RAW / "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json").read_text()
    )
    assert e_report["report_id"] in cal.starts
    assert all(r.grid_in_calibration for r in pc.check([CALL8]).rows)
    rec = dict(_records(CALL6)[0], config="W4_llama8b_s128_t4096_cap64")
    path = tmp_path / "w4.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (row,) = pc.check([path]).rows
    assert row.architecture_in_calibration and not row.grid_in_calibration


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "not_json.jsonl": "nope\n",
        "no_config.jsonl": '{"mode": "alone"}\n',
        "bad_kv.jsonl": '{"config": "A_llama8b_s128_t4096", "mode": "alone", "kv_bytes": "x"}\n',
        "empty.jsonl": "",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        capsys.readouterr()
        assert pc.main([str(p)]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("preflight_check: "), err
    assert pc.main([str(tmp_path / "missing.jsonl")]) == 2
    assert pc.main([str(RAW / "results.call9.jsonl")]) == 2  # only configurations not in CONFIGS


def test_leaving_the_grid_out_predicts_a_calibration_grid_without_its_starts() -> None:
    """E's grid is a calibration grid: left out, its prediction comes from a fit without E's
    starts and without any EAGLE3 start, so it moves; the family table names the drafter."""
    shipped = pc.check([CALL8])
    held = pc.check([CALL8], leave_out=True)
    assert [r.predicted_kv_bytes for r in held.rows] != [r.predicted_kv_bytes for r in shipped.rows]
    families = pc.family_summary(held.rows)
    assert list(families) == ["eagle3"]
    worst = families["eagle3"]["worst_error_bytes"]
    assert worst == max((r.error_bytes for r in held.rows), key=abs)


def test_each_configuration_tests_one_family() -> None:
    """From each configuration's config.json and grid: 8 experts are few, 128 many; MLA by its
    heads; an index_topk model is DSA; vLLM's own grid or utilization is serve defaults."""
    expected = {
        "X_mixtral4l_s64_t2048": "moe few experts",
        "M_qwen3moe8l_s64_t2048": "moe many experts",
        "L_dsv2lite8l_s64_t2048_fa": "mla 16 heads",
        "K_mla64h8l_s64_t2048_fa": "mla 64 heads",
        "V3_dsv3mla5l_s64_t2048_fa": "mla 128 heads",
        "S_dsv32_4l_s64_t2048_ctxdense": "dsa",
        "C_llama8b_eagle3k3_s64_t4096": "eagle3",
        "Q8_llama8b_fp8w_s128_t4096": "fp8",
        "X_mixtral4l_s1024_t8192": "serve defaults",
        "A_llama8b_s128_t4096_udef": "serve defaults",
        "A_llama8b_s128_t4096": "dense",
    }
    got = {name: pc.family_of(name, preflight(pc.question(name))) for name in expected}
    assert got == expected


def test_a_full_batch_step_past_the_others_is_the_truth() -> None:
    """Call 50's Qwen3-Next-class starts ran the full-batch step, which went furthest past the
    budget (64 prompts: their GDN states and the prompt-logprobs chunk)."""
    path = RAW / "results.call50.jsonl"
    c = pc.check([path])
    for row in c.rows:
        rec = _records(path)[row.line - 1]
        batch = rec["batch_step_usage_minus_budget_bytes"]
        assert batch > max(
            rec["step_usage_minus_budget_bytes"], rec["context_step_usage_minus_budget_bytes"]
        )
        assert row.truth_from == "serving peak"
        # plus the carry shim's two silu_and_mul temporaries of the first step's MoE layers
        # (2,047 tokens x top-10 x 512 x 2 B = 20,961,280 B each, a 20 MiB segment each),
        # which stayed reserved through the later steps
        assert row.standin_scratch_bytes == 2 * (20 << 20)
        assert row.truth_kv_bytes == rec["kv_bytes"] - batch + 2 * (20 << 20)


def test_the_shims_silu_temporaries_are_the_ones_the_step_history_holds() -> None:
    """Call 35's Mixtral step history: at the step's peak two blocks from the shim's
    silu_and_mul are live, 2,047 tokens x top-2 x 14,336 x 2 B = 117,374,976 B each; each
    reserves a segment rounded up to 2 MiB (112 MiB)."""
    import gzip
    import pickle

    history = RAW / "call35-logs/X_mixtral4l_s64_t2048.apply-hist-stephist.step.pickle.gz"
    with gzip.open(history) as f:
        trace = pickle.load(f)["device_traces"][0]
    shim = [
        e["size"]
        for e in trace
        if e["action"] == "alloc" and any("silu_and_mul" in fr["name"] for fr in e["frames"])
    ]
    assert set(shim) == {2047 * 2 * 14336 * 2}
    assert pc.shim_silu_scratch("X_mixtral4l_s64_t2048", 2047) == 2 * (112 << 20)
    assert pc.shim_silu_scratch("A_llama8b_s128_t4096", 4095) == 0  # no routed experts


def test_a_batch_step_narrower_than_a_chunk_takes_the_derived_one() -> None:
    """Call 45's Llama-8B start at vLLM's default utilization: its full-batch step sent 7-token
    prompts, 896 rows of logits that fit the freed gate_up block (the step grew nothing), where
    serving's widest chunk of 1,024 rows reserves 252 MiB more than the first step."""
    path = RAW / "results.call45.jsonl"
    c = pc.check([path])
    rows = [r for r in c.rows if r.config == "A_llama8b_s128_t4096_udef"]
    assert rows
    for row in rows:
        rec = _records(path)[row.line - 1]
        assert rec.get("batch_step_prompt_tokens") is None and rec["batch_step_seqs"] == 128
        assert rec["batch_step_usage_minus_budget_bytes"] == rec["step_usage_minus_budget_bytes"]
        assert row.truth_kv_bytes == rec["kv_bytes"] - rec["step_usage_minus_budget_bytes"] - (
            252 << 20
        )
