"""The H200 DSA start (call 33, S_dsv32_4l_s64_t2048_bf16: DeepSeek-V3.2 with 4 layers, the DSA
indexer through lab/dsa_standins.py giving the SM100 pair, BF16 logits and vLLM's FP32 copy;
memest apply with the allocator history kept): the indexer's decode logits named and sized at
every FULL capture size, in both capture passes.

Data: tests/data/starts/call33.*, copied unchanged from reports/vllm/raw/. Expected sizes are
worked by hand from vLLM's sparse_attn_indexer (logits [B x (1 + K), max_model_len], one call per
indexer layer) and the start's grid, never from the analysis under test.
"""

from __future__ import annotations

from pathlib import Path

from lab.dsa_logits_law import check

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
RUN = "call33.S_dsv32_4l_s64_t2048_bf16.apply-hist"
REPORT = STARTS / f"{RUN}.report.rank0.json"
SNAPSHOT = STARTS / f"{RUN}.snapshot.rank0.json.gz"
# vLLM 0.33.0's FULL decode sizes for max_num_seqs 64 (no speculation): its capture sizes up to 64
FULL_REQUESTS = [64, 56, 48, 40, 32, 24, 16, 8, 4, 2, 1]
MAX_MODEL_LEN, LAYERS = 4096, 4


def test_every_full_graph_holds_each_layers_bf16_logits_and_their_fp32_copy() -> None:
    for phase in ("graph_profiling", "capture"):
        lines = check(SNAPSHOT, REPORT, 2, phase)
        assert len(lines) == len(FULL_REQUESTS), lines
        for b, line in zip(FULL_REQUESTS, lines, strict=True):
            bf16, fp32 = b * MAX_MODEL_LEN * 2, b * MAX_MODEL_LEN * 4
            assert line == (
                f"ok {phase} B={b}: indexer_logits_bf16 {LAYERS} x {bf16} B, "
                f"indexer_logits_fp32 {LAYERS} x {fp32} B"
            )


def test_named_as_fp32_kernel_output_the_same_history_breaks_the_law() -> None:
    # the SM90 reading (one FP32 tensor) does not fit a history that holds vLLM's FP32 copy
    assert all(line.startswith("FAIL") for line in check(SNAPSHOT, REPORT, 4, "capture"))
