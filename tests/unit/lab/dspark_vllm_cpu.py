"""vLLM 0.33.0 reads the lab's DSpark configuration, on its CPU platform.

    VLLM_USE_V2_MODEL_RUNNER=1 VLLM_TARGET_DEVICE=cpu python tests/unit/lab/dspark_vllm_cpu.py

Builds the engine configuration of P_qwen3_8b12l_dspark7_s64_t2048 (lab/vllm_runs.py) as `LLM`
would and prints, as one JSON line, what vLLM resolved for the drafter. Run by
tests/unit/lab/test_dspark_vllm.py in a subprocess of its own. The V2 model runner is asked for:
it is the one that runs DSpark (vLLM picks it on a GPU; on the CPU, without Triton, it would pick
V1, which refuses DSpark). No model is built (Qwen3DSparkModel's speculator needs CUDA).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit" / "preflight")]


def main() -> int:
    import vllm_meta
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    from lab.vllm_runs import CONFIGS

    cfg = CONFIGS["P_qwen3_8b12l_dspark7_s64_t2048"]
    spec = json.loads(cfg["spec"])
    # vLLM reads config.json from a folder; both configs are copied into folders of their own
    spec["model"] = vllm_meta._model_dir(str(Path(spec["model"]) / "config.json"))
    args = EngineArgs(
        model=vllm_meta._model_dir(str(Path(cfg["model"]) / "config.json")),
        skip_tokenizer_init=True,
        load_format="dummy",
        max_model_len=4096,
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["mbt"],
        speculative_config=spec,
    )
    engine = args.create_engine_config()
    sc = engine.speculative_config
    assert sc is not None and sc.draft_model_config is not None
    hf = sc.draft_model_config.hf_config
    row = {
        "method": sc.method,
        "use_dspark": sc.use_dspark(),
        "num_speculative_tokens": sc.num_speculative_tokens,
        "architectures": sc.draft_model_config.architectures,
        "sample_from_anchor": getattr(hf, "sample_from_anchor", True),
        "aux_layers": list(get_eagle3_aux_layers_from_config(sc) or []),
        "num_lookahead_tokens": engine.num_lookahead_tokens,
        "draft_attention_backend": str(sc.attention_backend),
        "use_v2_model_runner": engine.use_v2_model_runner,
    }
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
