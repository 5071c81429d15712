"""Golden outputs of ``memest estimate`` (the what-if and its inverse questions) and
``memest preflight`` for every committed what-if grid and pre-flight case.

The grids are those of lab/whatif_grids.py (W1-W4 from call 11's start A), of lab/whatif_terms.py
(one start's configuration overlaid on another's, written out here as the ``--grid`` a user
types), the MLA and MoE starts of call 12, and the refusals a user meets; the pre-flight cases are
the example config and the lab models of reports/preflight/unseen.json. The MLA replay case
(call 12's 1.6 MB history) is in test_golden_whatif_mla_replay.py. The files under
tests/data/golden/ hold what was printed when they were last written: these tests detect a
change, not the truth of a figure (tests/golden.py; the hand-derived and measured figures are
asserted elsewhere). Every figure printed since must be the same, byte for byte, or the change
regenerated with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from tests.golden import check

ROOT = Path(__file__).resolve().parents[2]
RAW = "tests/data/starts"
A = f"{RAW}/call11.A_llama8b_s128_t4096.enable-cold"
B = f"{RAW}/call6.B_llama8b_s32_t2048.apply"
C = f"{RAW}/call6.C_llama8b_eagle3k3_s64_t4096.apply"
E = f"{RAW}/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply"
S = f"{RAW}/call9.S_llama8b_s128_t4096.apply"
MLA = f"{RAW}/call12.L_dsv2lite8l_s64_t2048.apply-hist"
MOE = f"{RAW}/call12.M_qwen3moe8l_s64_t2048.apply-hist"
MODEL = "examples/llama8b.config.json"
DRAFTER = "examples/eagle3_8b.config.json"
EAGLE3_K3 = {"method": "eagle3", "num_speculative_tokens": 3}


def _grid(**changes: object) -> str:
    return json.dumps(changes)


def _start(config: dict[str, object], spec: dict[str, object] | None) -> str:
    """lab/whatif_terms.py's grid: a start's scheduler limits, length, utilization and drafter."""
    return json.dumps({**config, "max_model_len": 4096, "speculative_config": spec})


TERMS = {
    "B": {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.85},
    "C": {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.85},
    "E": {"max_num_seqs": 96, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.88},
}

#: name -> memest estimate arguments (each case is printed as JSON and as text).
ESTIMATE_CASES: dict[str, list[str]] = {
    "W1": ["--from", f"{A}.report.rank0.json", "--grid", _grid(max_num_seqs=32)],
    "W2": ["--from", f"{A}.report.rank0.json", "--grid", _grid(max_num_batched_tokens=8192)],
    "W3": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(speculative_config=EAGLE3_K3),
        "--drafter-config",
        DRAFTER,
    ],
    "W3-no-drafter-config": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(speculative_config=EAGLE3_K3),
    ],
    "W4": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(compilation_config={"max_cudagraph_capture_size": 64}),
    ],
    "W1-replay": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(max_num_seqs=32),
        "--snapshot",
        f"{A}.snapshot.rank0.json.gz",
    ],
    "W3-replay": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(speculative_config=EAGLE3_K3),
        "--drafter-config",
        DRAFTER,
        "--snapshot",
        f"{A}.snapshot.rank0.json.gz",
    ],
    "W4-replay": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(compilation_config={"max_cudagraph_capture_size": 64}),
        "--snapshot",
        f"{A}.snapshot.rank0.json.gz",
    ],
    "utilization": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(gpu_memory_utilization=0.9, max_model_len=8192),
        # A length past the start's own needs the model's positions (max_position_embeddings).
        "--model-config",
        MODEL,
    ],
    "inverse-kv-tokens": [
        "--from",
        f"{A}.report.rank0.json",
        "--grid",
        _grid(max_num_seqs=32),
        "--kv-tokens",
        "400000",
    ],
    "inverse-concurrency-own-grid": [
        "--from",
        f"{S}.report.rank0.json",
        "--model-config",
        MODEL,
        "--concurrency",
        "200",
    ],
    "plan-input": [
        "--from",
        f"{S}.report.rank0.json",
        "--grid",
        _grid(sizing="vllm-0.33.0", sm100=False, max_num_seqs=64, max_num_batched_tokens=4096),
        "--margin",
        "64MiB",
    ],
    "terms-C-to-B": [
        "--from",
        f"{C}.report.rank0.json",
        "--grid",
        _start(TERMS["B"], None),
        "--model-config",
        MODEL,
        "--drafter-config",
        DRAFTER,
    ],
    "terms-B-to-E": [
        "--from",
        f"{B}.report.rank0.json",
        "--grid",
        _start(TERMS["E"], {"method": "eagle3", "num_speculative_tokens": 5}),
        "--model-config",
        MODEL,
        "--drafter-config",
        DRAFTER,
    ],
    "terms-E-to-C": [
        "--from",
        f"{E}.report.rank0.json",
        "--grid",
        _start(TERMS["C"], EAGLE3_K3),
        "--model-config",
        MODEL,
        "--drafter-config",
        DRAFTER,
    ],
    "terms-S-to-C": [
        "--from",
        f"{S}.report.rank0.json",
        "--grid",
        _start(TERMS["C"], EAGLE3_K3),
        "--model-config",
        MODEL,
        "--drafter-config",
        DRAFTER,
    ],
    "mla-model-len": [
        "--from",
        f"{MLA}.report.rank0.json",
        "--grid",
        _grid(max_model_len=2048, max_num_seqs=32),
    ],
    "moe-batched-tokens": [
        "--from",
        f"{MOE}.report.rank0.json",
        "--grid",
        _grid(max_num_batched_tokens=4096),
        "--kv-tokens",
        "100000",
    ],
}

#: name -> memest estimate arguments that are refused (exit 2, one line on stderr).
ESTIMATE_REFUSALS: dict[str, list[str]] = {
    "unknown-field": ["--grid", _grid(max_num_sequences=3)],
    "bad-value": ["--grid", _grid(max_num_seqs=0)],
    "does-not-fit": ["--grid", _grid(gpu_memory_utilization=0.05)],
    "model-len-too-long": ["--grid", _grid(max_model_len=1 << 20)],
    "bad-plan": ["--grid", json.dumps({"runners": [], "total_graphs": 3})],
    "bad-plan-input": ["--grid", _grid(sizing="vllm-0.33.0", sm100=False, speed=1)],
    "both-questions": ["--kv-tokens", "10", "--concurrency", "2"],
    "inverse-out-of-reach": ["--grid", "{}", "--kv-tokens", str(10**9)],
}

#: name -> memest preflight arguments.
PREFLIGHT_CASES: dict[str, list[str]] = {
    "llama8b-defaults": ["--model-config", MODEL],
    "llama8b-grid": [
        "--model-config",
        MODEL,
        "--max-num-seqs",
        "128",
        "--max-num-batched-tokens",
        "4096",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.85",
    ],
    "llama8b-eagle3": [
        "--model-config",
        MODEL,
        "--max-num-seqs",
        "64",
        "--speculative-config",
        json.dumps(EAGLE3_K3),
        "--draft-model-config",
        DRAFTER,
        "--compilation-config",
        json.dumps({"max_cudagraph_capture_size": 256}),
    ],
    "llama8b-tp2": ["--model-config", MODEL, "--tensor-parallel-size", "2"],
    "dsv2lite-mla": [
        "--model-config",
        "lab/models/dsv2lite_8l/config.json",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "2048",
        "--max-model-len",
        "4096",
        "--attention-backend",
        "FLASHMLA",
    ],
    "qwen3moe": [
        "--model-config",
        "lab/models/qwen3moe_8l/config.json",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "2048",
        "--gpu-memory-utilization",
        "0.85",
    ],
    "qwen3-dense": [
        "--model-config",
        "lab/models/qwen3_8b_12l/config.json",
        "--max-model-len",
        "4096",
        "--dtype",
        "float16",
    ],
}

PREFLIGHT_REFUSALS: dict[str, list[str]] = {
    "bad-seqs": ["--model-config", MODEL, "--max-num-seqs", "0"],
    "bad-spec": ["--model-config", MODEL, "--speculative-config", '{"method": "nope"}'],
    "does-not-fit": ["--model-config", MODEL, "--gpu-memory-utilization", "0.05"],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the arguments name committed files relative to the root


@pytest.mark.parametrize("name", sorted(ESTIMATE_CASES))
def test_estimate_outputs_are_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", *ESTIMATE_CASES[name]]
    code, text, err = _run(argv, capsys)
    assert (code, err) == (0, "")
    check(f"estimate/{name}.txt", text)
    code, out, err = _run([*argv, "--json"], capsys)
    assert (code, err) == (0, "")
    check(f"estimate/{name}.json", out)


@pytest.mark.parametrize("name", sorted(ESTIMATE_REFUSALS))
def test_estimate_refusals_are_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--from", f"{A}.report.rank0.json", *ESTIMATE_REFUSALS[name]]
    code, out, err = _run(argv, capsys)
    assert (code, out) == (2, "")
    check(f"estimate/refused-{name}.txt", err)


@pytest.mark.parametrize("name", sorted(PREFLIGHT_CASES))
def test_preflight_outputs_are_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["preflight", *PREFLIGHT_CASES[name]]
    code, text, err = _run(argv, capsys)
    assert (code, err) == (0, "")
    check(f"preflight/{name}.txt", text)
    code, out, err = _run([*argv, "--json"], capsys)
    assert (code, err) == (0, "")
    check(f"preflight/{name}.json", out)


@pytest.mark.parametrize("name", sorted(PREFLIGHT_REFUSALS))
def test_preflight_refusals_are_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["preflight", *PREFLIGHT_REFUSALS[name]], capsys)
    assert (code, out) == (2, "")
    check(f"preflight/refused-{name}.txt", err)
