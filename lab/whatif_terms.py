"""Per-term what-if residuals on real H200 starts: predict each start from every other one.

For every ordered pair (G, G') of real vLLM 0.33.0 starts of one model at different grids
(reports/vllm/raw), ``memest.estimate.what_if`` predicts G''s full-initialization terms from G's
report alone, and each term is printed beside the one G''s own report measured. The drafter's
activation factor is the H200 calibration's (memest.preflight.calibration), as ``memest
estimate --grid`` passes it. B is call 6's start (the current activation definition; call 5's B
read the profile pass by the definition before the fix, reports/vllm/README.md).

    python lab/whatif_terms.py > reports/vllm/whatif_terms.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from whatif_tools import grid_changes  # noqa: E402

from memest.cli._reports import load_report  # noqa: E402
from memest.estimate import full_init_kv_budget, full_init_terms, what_if  # noqa: E402
from memest.estimate.phases import TERM_FIELDS  # noqa: E402
from memest.estimate.runner_buffers import ModelDims  # noqa: E402
from memest.preflight.calibration import what_if_calibration  # noqa: E402
from memest.schema import RunReport  # noqa: E402

RAW = ROOT / "reports" / "vllm" / "raw"
STARTS = (
    "call9.S_llama8b_s128_t4096.apply",
    "call6.B_llama8b_s32_t2048.apply",
    "call6.C_llama8b_eagle3k3_s64_t4096.apply",
    "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply",
)
MODEL = ROOT / "examples" / "llama8b.config.json"
DRAFTER = ROOT / "examples" / "eagle3_8b.config.json"
MiB = 1 << 20


def pair(a: RunReport, b: RunReport, dims: ModelDims | None) -> dict[str, Any]:
    cal = what_if_calibration(a)
    result = what_if(a, grid_changes(b.config), dims=dims, calibration=cal)
    measured = full_init_terms(b)
    assert result.terms_to is not None and result.terms_from is not None
    rows = {}
    for term in TERM_FIELDS:
        rows[term] = {
            "at_g": getattr(result.terms_from, term),
            "predicted": getattr(result.terms_to, term),
            "measured": getattr(measured, term),
            "law": result.term_laws.get(term, "constant"),
        }
    kv_measured = full_init_kv_budget(measured)
    return {
        "terms": rows,
        "kv_budget_predicted": result.kv_budget_bytes_to,
        "kv_budget_measured_terms": kv_measured,
    }


def main() -> int:
    reports = {name: load_report(RAW / f"{name}.report.rank0.json") for name in STARTS}
    dims = ModelDims.from_hf_config(
        json.loads(MODEL.read_text()), drafter=json.loads(DRAFTER.read_text())
    )
    out: list[dict[str, Any]] = []
    for ga in STARTS:
        for gb in STARTS:
            if ga == gb:
                continue
            row = pair(reports[ga], reports[gb], dims)
            row.update({"from": ga, "to": gb})
            out.append(row)
            print(f"\n{ga} -> {gb}")
            print(f"  {'term':32} {'at G':>10} {'pred G2':>10} {'meas G2':>10} {'resid':>8}  law")
            for term, r in row["terms"].items():
                resid = (r["predicted"] - r["measured"]) / MiB
                print(
                    f"  {term:32} {r['at_g'] / MiB:10.1f} {r['predicted'] / MiB:10.1f} "
                    f"{r['measured'] / MiB:10.1f} {resid:+8.1f}  {r['law']}"
                )
            kv_p, kv_m = row["kv_budget_predicted"], row["kv_budget_measured_terms"]
            print(
                f"  {'KV budget (MiB)':32} {'':>10} {kv_p / MiB:10.1f} {kv_m / MiB:10.1f} "
                f"{(kv_p - kv_m) / MiB:+8.1f}"
            )
    if "--json" in sys.argv:
        json.dump(out, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
