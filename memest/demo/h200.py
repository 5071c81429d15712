"""Real starts for the demo: rank-0 reports of vLLM 0.33.0 starts on one H200, copied verbatim
from reports/vllm/raw (see reports/vllm/README.md for the commands that made them).

One of each kind a first-time user asks about: a dense model started with vLLM's own budget and
with memest's (one configuration, two modes), EAGLE3 speculative decoding, a mixture-of-experts
model, an MLA model, and `vllm serve` with its default flags. Unlike the published figures they
carry every phase reading, so the run page draws the whole GPU and the what-if form answers.
"""

from __future__ import annotations

from importlib import resources

from memest.schema import RunReport

#: File in memest/demo/h200 -> what it shows (reports/vllm/raw/<name>.report.rank0.json).
H200_STARTS = {
    "call20.S_llama8b_s128_t4096.enable": "dense Llama 8B, vLLM's own KV budget",
    "call22.S_llama8b_s128_t4096.apply": "dense Llama 8B, memest's KV budget (apply)",
    "call13.C_llama8b_eagle3k3_s64_t4096.enable": "Llama 8B with an EAGLE3 drafter, K=3",
    "call17.M_qwen3moe8l_s64_t2048.apply-hist": "Qwen3 MoE (8 layers), memest's KV budget",
    "call21.L_dsv2lite8l_s64_t2048_fa.apply": "DeepSeek-V2-Lite MLA (8 layers), memest's budget",
    "call24.V_llama8b_defaults.apply": "vllm serve with its default flags",
}


def h200_reports() -> list[RunReport]:
    """The real H200 starts of the demo, in the order of H200_STARTS."""
    folder = resources.files("memest.demo") / "h200"
    return [
        RunReport.model_validate_json((folder / f"{name}.json").read_text()) for name in H200_STARTS
    ]
