"""Refit the pre-flight calibration from the committed measured starts and print the residuals.

    python lab/preflight_fit.py                 # print the fit, per-start residuals, leave-one-out
    python lab/preflight_fit.py --write         # also store the coefficients in memest/preflight/data
                                                # and the tables in reports/preflight/

Every committed real start is the Llama-3-8B shape (with and without an EAGLE3 drafter), TP 1,
on one H200 (vLLM 0.33.0, CUDA 13): the configs it ran are tests/data/configs/llama8b.json and
eagle3_8b.json. Starts that calibrate: a warm profile pass and figures memest recomputes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.fit import (  # noqa: E402
    TERMS,
    Residual,
    Start,
    calibrate,
    leave_one_out,
    residuals,
    start_from_report,
    vllm_overshoot,
)
from memest.preflight.calibration import (  # noqa: E402
    CALIBRATIONS,
    load_calibration,
    overshoot_line,
)
from memest.schema import RunReport  # noqa: E402

#: The calibration sees the first ten calls (and the unnumbered starts before them); every
#: later call is held out, so that lab/preflight_check.py compares the pre-flight with models
#: and grids it did not include.
FIRST_HELD_OUT_CALL = 11


def _held_out(path: Path) -> bool:
    stem = path.name.split(".", 1)[0]
    number = stem.removeprefix("call")
    return stem.startswith("call") and number.isdigit() and int(number) >= FIRST_HELD_OUT_CALL


REPORTS = sorted(
    p for p in (ROOT / "reports/vllm/raw").glob("*.report.rank0.json") if not _held_out(p)
)
CONFIGS = ROOT / "tests/data/configs"
LAB_MODELS = ROOT / "lab/models"
DATA = ROOT / "memest/preflight/data"
OUT = ROOT / "reports/preflight"
COMMAND = "python lab/preflight_fit.py --write"
GIB = 1 << 30
MIB = 1 << 20


def _configs(report: RunReport) -> tuple[dict[str, object], dict[str, object] | None]:
    name = Path(report.config.model).name
    path = CONFIGS / f"{name}.json"
    if not path.exists():  # the lab's own shapes (MoE, MLA, Qwen3) keep theirs in lab/models
        path = LAB_MODELS / name / "config.json"
    cfg = json.loads(path.read_text())
    draft = None
    if report.config.speculative_method == "eagle3":
        draft = json.loads((CONFIGS / "eagle3_8b.json").read_text())
    return cfg, draft


def load_starts() -> list[Start]:
    seen: set[str] = set()
    starts: list[Start] = []
    for path in REPORTS:
        report = RunReport.model_validate_json(path.read_text())
        if report.report_id in seen:
            continue
        seen.add(report.report_id)
        st = start_from_report(report, *_configs(report))
        if st is not None:
            starts.append(st)
    return starts


def _gib(b: int | None) -> str:
    return "–" if b is None else f"{b / GIB:+.3f}"


def table(rows: list[Residual], title: str) -> list[str]:
    out = [
        f"## {title}",
        "",
        "| start | grid | KV sized by | exact KV budget (GiB) | memest pre-flight − exact | ± "
        "| vLLM's estimate − exact |"
        + "".join(f" {t.replace('_bytes', '')} (MiB) |" for t in TERMS),
        "|---|---|---|---|---|---|---|" + "---|" * len(TERMS),
    ]
    for r in rows:
        st = r.start
        out.append(
            f"| {st.report_id[:12]} | {st.group} | {'vLLM' if st.vllm_sized else 'memest'} | "
            f"{st.exact_kv_bytes / GIB:.3f} | {_gib(r.kv_error_bytes)} | "
            f"{r.uncertainty_bytes / GIB:.3f} | {_gib(r.vllm_error_bytes)} |"
            + "".join(f" {r.term_residuals[t] / MIB:+.1f} |" for t in TERMS)
        )
    worst = max(abs(r.kv_error_bytes) for r in rows) if rows else 0
    over = vllm_overshoot(rows)
    vllm = "no start here was sized by vLLM" if over is None else overshoot_line(over)
    out += ["", f"Largest |memest − exact|: {worst / GIB:.3f} GiB; {vllm}.", ""]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store coefficients and tables")
    args = parser.parse_args(argv)
    template = load_calibration("h200")
    starts = load_starts()
    cal = calibrate(starts, template).model_copy(update={"command": COMMAND})
    fitted = table(residuals(starts, cal), "In-sample: every start predicted by the fit of all")
    loo = leave_one_out(starts, template)
    held = [r for rows in loo.values() for r in rows]
    lines = [
        "# Pre-flight calibration: H200, vLLM 0.33.0, CUDA 13 (Llama-3-8B shape starts)",
        "",
        f"Command: `{COMMAND}`. Starts: {len(starts)} in {len({s.group for s in starts})} grids.",
        "Error = predicted KV budget − exact KV budget (measured KV − (usage − budget)); "
        "term columns: predicted − measured.",
        "vLLM 0.33.0's grid-sized buffers (memest.estimate.runner_buffers: input, request-state "
        "and drafter buffers, penalties and structured-output masks, the sampler's top-k/top-p "
        "buffer, block tables) are computed, not fitted; the coefficients fit what each term "
        "holds beyond them.",
        "",
        "Coefficients: " + json.dumps(cal.coefficients.model_dump()),
        "",
        *fitted,
        *table(held, "Leave one grid out: each grid predicted by the fit of the other grids"),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        DATA.mkdir(parents=True, exist_ok=True)
        (DATA / CALIBRATIONS["h200"]).write_text(
            json.dumps(cal.model_dump(), indent=2, sort_keys=True) + "\n"
        )
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "fit.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
