"""Pre-flight predictions against real H200 starts, models and grids the calibration did not include.

    python lab/preflight_check.py reports/vllm/raw/results.callN.jsonl [...]   # print the table
    python lab/preflight_check.py --write FILES...   # also store reports/preflight/unseen.{json,md}

For every start record of lab/vllm_runs.py (one JSON line per start) whose configuration is in
its CONFIGS, the configuration is turned into the pre-flight question ``memest preflight`` and
the API ask (memest.preflight.request_from, then memest.preflight.preflight) and the predicted
KV budget is compared with the KV that fills the start's budget exactly:

    truth = kv_bytes - step_usage_minus_budget_bytes

(usage at serving's first full-size step minus the budget; from call 15 on the larger of that
and the step over cached context that follows it, serving's peak); a record without the step
figure falls back to usage_minus_budget_bytes (end of init + the profile pass's activation peak),
and the table says which. Starts lab/summarize_vllm.py marks diagnostic (a lab stand-in that
allocates what no GPU deployment does) are skipped. For a start of vLLM alone, vLLM's own estimate is the KV it allocated
(its kv_bytes), shown beside with its error against that start's truth.

A configuration is "in the calibration" by architecture when the calibration's
measured_architectures hold it, and by grid when one of the calibration's starts asked the same
pre-flight question (lab/preflight_fit.py's starts, request for request).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from lab.preflight_fit import load_starts  # noqa: E402
from lab.standin_scratch import history_scratch_bytes  # noqa: E402
from lab.summarize_vllm import DIAGNOSTIC_STARTS  # noqa: E402
from lab.vllm_runs import CONFIGS  # noqa: E402
from memest.errors import MemestError  # noqa: E402
from memest.files import load_json_file, parse_json, read_regular_file  # noqa: E402
from memest.preflight import preflight, request_from  # noqa: E402
from memest.preflight.calibration import Calibration, load_calibration  # noqa: E402
from memest.schema.preflight import PreflightRequest, PreflightResult  # noqa: E402
from memest.units import fmt_gib  # noqa: E402

OUT = ROOT / "reports/preflight"
CONFIG_FILES = ROOT / "tests/data/configs"
GPU = "h200"
GIB = 1 << 30
#: The issue's bar: predicted KV budget within this of the truth, per rank.
TOLERANCE_BYTES = GIB // 4
#: What lab/vllm_runs.py's child() gives every start beside CONFIGS (LLM(...) keywords).
LAB_MAX_MODEL_LEN = 4096
LAB_ATTENTION_BACKEND = "TRITON_ATTN"
#: CONFIGS keys that change a start but are no input of the pre-flight question.
NOT_ASKED = ("mla_prefill_backend", "standins", "fp8_standins")
MAX_RESULTS_BYTES = 64 << 20
#: Configurations whose step over cached context stayed narrower than serving's widest for the
#: same question: their truth is left out of the per-architecture summary (listed in the table).
NARROWER_CONTEXT_STEP = {
    "S_dsv32_4l_s64_t2048": "uniform queries: every request a decode (the sparse attend), no "
    "dense-MHA context chunk; S_dsv32_4l_s64_t2048_ctxdense18 asks the same question",
    "S_dsv32_4l_s64_t2048_bf16": "as S_dsv32_4l_s64_t2048",
    "S_dsv32_4l_s64_t2048_ctxmix": "vLLM's batch reorder left one prefill over cached context "
    "(1,984 of the chunk's rows); S_dsv32_4l_s64_t2048_ctxdense18 asks the same question",
    "S_dsv32_4l_s64_t2048_m64k_bf16": "as S_dsv32_4l_s64_t2048; no wider step ran at 65,536",
}


class InputError(MemestError, ValueError):
    """A results file or record the check cannot read (one line, exit 2)."""


def _model_config(model: str) -> dict[str, Any]:
    """config.json of a CONFIGS model path: lab/models/<name>/config.json travels in the repo;
    the carried Llama and EAGLE3 models' configs are tests/data/configs/<name>.json."""
    path = Path(model) / "config.json"
    if not path.is_file():
        path = CONFIG_FILES / f"{Path(model).name}.json"
    data = load_json_file(path, error=InputError)
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a JSON object")
    return data


def question(name: str) -> PreflightRequest:
    """The pre-flight question of CONFIGS[name], as lab/vllm_runs.py starts it (TP 1)."""
    cfg = CONFIGS[name]
    spec = json.loads(cfg["spec"]) if cfg.get("spec") else None
    if spec is not None:  # the draft's attention backend is the target's (TRITON_ATTN) here
        spec.pop("attention_backend", None)
    fields: dict[str, Any] = {
        "model_config": _model_config(cfg["model"]),
        "gpu": GPU,
        "tensor_parallel_size": 1,
        "max_num_seqs": cfg["max_num_seqs"],
        "max_num_batched_tokens": cfg["mbt"],
        "max_model_len": cfg.get("max_model_len", LAB_MAX_MODEL_LEN),
        "speculative_config": spec,
        "compilation_config": cfg.get("compilation"),
        "attention_backend": cfg.get("attention_backend", LAB_ATTENTION_BACKEND),
        "kv_cache_dtype": cfg.get("kv_cache_dtype", "auto"),
    }
    if cfg["util"] is not None:  # None: vLLM's default, which the pre-flight takes when unset
        fields["gpu_memory_utilization"] = cfg["util"]
    if cfg.get("mla_prefill_backend") == "FLASH_ATTN":
        fields["attention_config"] = {"flash_attn_version": 2}  # the lab's stand-in is FA2
    if spec is not None and spec.get("model"):
        fields["draft_model_config"] = _model_config(spec["model"])
    return request_from(fields)


def _grid_key(req: PreflightRequest) -> str:
    """A question without what the calibration's starts do not record: the attention backend
    (16-token blocks either way for a dense model on an H200) and the drafter's path in the
    speculative config (its config.json is compared)."""
    q = req.model_dump(by_alias=True, exclude={"attention_backend"})
    if q["speculative_config"] is not None:
        q["speculative_config"] = {k: v for k, v in q["speculative_config"].items() if k != "model"}
    return json.dumps(q, sort_keys=True)


def calibration_questions(cal: Calibration) -> set[str]:
    """The questions the calibration's starts asked (lab/preflight_fit.py's view of them)."""
    return {_grid_key(st.request) for st in load_starts() if st.report_id in cal.starts}


@dataclass
class Row:
    source: str
    line: int
    config: str
    mode: str
    architecture: str
    family: str
    architecture_in_calibration: bool
    grid_in_calibration: bool
    predicted_kv_bytes: int
    predicted_uncertainty_bytes: int
    truth_kv_bytes: int
    # "serving peak" (the larger of the full-size step and the step over cached context), "step",
    # "step-partial" (fewer than max_num_batched_tokens - 1) or "end"
    truth_from: str
    error_bytes: int
    vllm_kv_bytes: int | None = None
    vllm_error_bytes: int | None = None
    not_asked: list[str] = field(default_factory=list)
    budget_matches: bool = True  # the record's budget is the prediction's requested bytes
    # segments the step opened for the lab stand-ins' temporaries, added back to the truth
    standin_scratch_bytes: int = 0


@dataclass
class Check:
    calibration: str
    rows: list[Row]
    skipped: list[str]
    predictions: dict[str, PreflightResult]


def _int(rec: Mapping[str, Any], key: str, where: str) -> int | None:
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{where}: {key} is {v!r}, not an integer")
    return v


def read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of a results jsonl file; one-line errors on anything else."""
    data = read_regular_file(path, limit=MAX_RESULTS_BYTES, error=InputError)
    out: list[tuple[int, dict[str, Any]]] = []
    for n, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        rec = parse_json(raw, source=f"{path}:{n}", error=InputError)
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{n}: a start record is a JSON object")
        for key in ("config", "mode"):
            if not isinstance(rec.get(key), str):
                raise InputError(f"{path}:{n}: no {key} string (not lab/vllm_runs.py's record)")
        out.append((n, rec))
    if not out:
        raise InputError(f"{path}: no start record")
    return out


def step_fills(rec: Mapping[str, Any], mbt: int, where: str) -> bool:
    """Whether the record's full-size step really ran max_num_batched_tokens - 1 tokens or more
    (a step of several prompts batched, or one prompt of that length); a record without
    step_tokens is taken as full. A shorter step needs less activation memory than serving's
    widest step: its truth overstates the KV that fits."""
    tokens = _int(rec, "step_tokens", where)
    return tokens is None or tokens >= mbt - 1


def _row(
    path: Path, n: int, rec: Mapping[str, Any], result: PreflightResult, grid_seen: bool
) -> Row | str:
    """The comparison of one record, or why it has none."""
    where = f"{path}:{n}"
    kv = _int(rec, "kv_bytes", where)
    step = _int(rec, "step_usage_minus_budget_bytes", where)
    end = _int(rec, "usage_minus_budget_bytes", where)
    if kv is None:
        return f"{path.name}:{n} {rec['config']}/{rec['mode']}: no kv_bytes (rc={rec.get('rc')})"
    if step is None and end is None:
        return f"{path.name}:{n} {rec['config']}/{rec['mode']}: no usage minus budget"
    cfg = CONFIGS[rec["config"]]
    over, source = (step, "step") if step is not None else (end, "end")
    if step is not None and not step_fills(rec, cfg["mbt"], where):
        source = "step-partial"
    context = _int(rec, "context_step_usage_minus_budget_bytes", where)
    scratch = 0
    if step is not None and context is not None:
        over, source = max(step, context), "serving peak"
        if context >= step:
            scratch = context_step_scratch(path, rec["config"])
    if rec["config"] in NARROWER_CONTEXT_STEP:
        source = "narrower context step"
    assert over is not None
    truth = kv - over + scratch
    alone = rec["mode"] == "alone"
    budget = _int(rec, "budget_bytes", where)
    return Row(
        source=path.name,
        line=n,
        config=rec["config"],
        mode=rec["mode"],
        architecture=result.model,
        family=result.family,
        architecture_in_calibration=result.measured_family,
        grid_in_calibration=grid_seen,
        predicted_kv_bytes=result.kv_budget_bytes,
        predicted_uncertainty_bytes=result.kv_cache_uncertainty_bytes,
        truth_kv_bytes=truth,
        truth_from=source,
        error_bytes=result.kv_budget_bytes - truth,
        vllm_kv_bytes=kv if alone else None,
        vllm_error_bytes=kv - truth if alone else None,
        not_asked=[k for k in NOT_ASKED if cfg.get(k)],
        budget_matches=budget is None or budget == result.terms.requested_bytes,
        standin_scratch_bytes=scratch,
    )


def context_step_scratch(path: Path, config: str) -> int:
    """Stand-in scratch (lab/standin_scratch.py) in the step over cached context of ``config``
    in the call of results file ``path``: from the call's step history of that configuration
    (every start of it in the call ran the same steps), 0 without one."""
    logs = path.parent / f"{path.stem.split('.')[-1]}-logs"
    found = sorted(logs.glob(f"{config}.*.context_step.pickle.gz"))
    return history_scratch_bytes(found[0]) if found else 0


def check(paths: Sequence[Path], cal: Calibration | None = None) -> Check:
    """Every start record of ``paths`` whose configuration is in CONFIGS, predicted and compared.

    Raises:
        InputError: a file or record the check cannot read, or no record to compare.
        ConfigError: the pre-flight refuses a configuration's question (named).
    """
    cal = cal or load_calibration(GPU)
    seen = calibration_questions(cal)
    rows: list[Row] = []
    skipped: list[str] = []
    predictions: dict[str, PreflightResult] = {}
    grid_seen: dict[str, bool] = {}
    for path in paths:
        for n, rec in read_records(path):
            name = rec["config"]
            if name not in CONFIGS:
                skipped.append(f"{path.name}:{n} {name}/{rec['mode']}: not in CONFIGS")
                continue
            why = DIAGNOSTIC_STARTS.get((path.stem.split(".")[-1], name))
            if why is not None:
                skipped.append(f"{path.name}:{n} {name}/{rec['mode']}: diagnostic ({why})")
                continue
            if rec.get("kv_bytes") is None:  # a start that did not come up: nothing to compare
                skipped.append(
                    f"{path.name}:{n} {name}/{rec['mode']}: no kv_bytes (rc={rec.get('rc')})"
                )
                continue
            if name not in predictions:
                req = question(name)
                predictions[name] = preflight(req, cal)
                grid_seen[name] = _grid_key(req) in seen
            row = _row(path, n, rec, predictions[name], grid_seen[name])
            if isinstance(row, str):
                skipped.append(row)
            else:
                rows.append(row)
    if not rows:
        raise InputError(
            f"no start of a CONFIGS configuration with kv_bytes in {', '.join(map(str, paths))}"
        )
    return Check(cal.label, rows, skipped, predictions)


# --------------------------------------------------------------------------- output
def _g(b: int | None, signed: bool = False) -> str:
    return "–" if b is None else fmt_gib(b, signed=signed)


def _in_cal(r: Row) -> str:
    if r.architecture_in_calibration and r.grid_in_calibration:
        return "yes"
    return "arch only" if r.architecture_in_calibration else "no"


def _truth_note(r: Row) -> str:
    if not r.standin_scratch_bytes:
        return r.truth_from
    return f"{r.truth_from}, less {_g(r.standin_scratch_bytes)} of stand-in scratch"


def table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| configuration | mode | start | architecture | in calibration | predicted KV GiB (±) "
        "| truth GiB (from) | error GiB | vLLM KV GiB | vLLM error GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.config} | {r.mode} | {r.source}:{r.line} | {r.architecture} ({r.family}) | "
            f"{_in_cal(r)} | {_g(r.predicted_kv_bytes)} ({_g(r.predicted_uncertainty_bytes)}) | "
            f"{_g(r.truth_kv_bytes)} ({_truth_note(r)}) | {_g(r.error_bytes, True)} | "
            f"{_g(r.vllm_kv_bytes)} | {_g(r.vllm_error_bytes, True)} |"
        )
    return out


def _profiled(row: Row) -> bool:
    """A start that ran vLLM's memory profiling, as the pre-flight's question does. A memest
    plan start loads a persisted startup plan instead and skips it: a different start."""
    return not row.mode.startswith("plan")


def _best(rows: Sequence[Row]) -> list[Row]:
    """The profiled rows of one configuration whose truth is serving's peak (a full-size step,
    then a step over cached context), else a full-size step, else a partial step, else all."""
    rows = [r for r in rows if _profiled(r)] or list(rows)
    for source in ("serving peak", "step", "step-partial", "narrower context step"):
        best = [r for r in rows if r.truth_from == source]
        if best:
            return best
    return list(rows)


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """Per configuration the worst |error| over its best-measured starts (the step figure where
    any start has it) and, over architectures the calibration lacks, those within
    TOLERANCE_BYTES on every such start."""
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.config, []).append(r)
    configs = {
        name: {
            "architecture": rs[0].architecture,
            "in_calibration": _in_cal(rs[0]),
            "starts": len(rs),
            "truth_from": best[0].truth_from,
            "starts_compared": len(best),
            "predicted_kv_bytes": rs[0].predicted_kv_bytes,
            "worst_error_bytes": max((r.error_bytes for r in best), key=abs),
            "worst_vllm_error_bytes": max(
                (r.vllm_error_bytes for r in best if r.vllm_error_bytes is not None),
                key=abs,
                default=None,
            ),
            "worst_plan_start_error_bytes": max(
                (
                    r.error_bytes
                    for r in rs
                    if not _profiled(r) and r.truth_from == best[0].truth_from
                ),
                key=abs,
                default=None,
            ),
            "not_asked": rs[0].not_asked,
            "budget_matches": all(r.budget_matches for r in rs),
        }
        for name, rs in by.items()
        for best in [_best(rs)]
    }
    unseen = [
        r
        for c in by.values()
        for r in _best(c)
        if not r.architecture_in_calibration and r.truth_from != "narrower context step"
    ]
    archs = sorted({r.architecture for r in unseen})
    within = [
        a
        for a in archs
        if all(abs(r.error_bytes) <= TOLERANCE_BYTES for r in unseen if r.architecture == a)
    ]
    return {
        "configurations": configs,
        "unseen_architectures": archs,
        "unseen_architectures_within_tolerance": within,
        "tolerance_bytes": TOLERANCE_BYTES,
    }


def render(c: Check, command: str) -> str:
    s = summary(c.rows)
    lines = [
        "# Pre-flight on starts the calibration did not include (H200, vLLM 0.33.0)",
        "",
        f"Command: `{command}`. Calibration: {c.calibration}.",
        "Predicted = `memest preflight`'s KV budget per rank for the configuration's question "
        "(lab/vllm_runs.py CONFIGS, max_model_len 4096, TP 1); truth = kv_bytes − "
        "(usage − budget), usage at serving's first full-size step (step) or, where a record "
        "lacks it, at the end of init plus the profile pass's activation peak (end); error = "
        "predicted − truth. vLLM's estimate = the KV a vLLM-alone start allocated. "
        "step-partial: the record's step ran fewer than max_num_batched_tokens − 1 tokens (its "
        "truth overstates the KV that fits); such a row is left out of the summary when the "
        "configuration has a full-size step. Stand-in scratch: segments the step over cached "
        "context opened for the lab's DSA stand-ins' own temporaries (lab/standin_scratch.py, "
        "from the call's step history), which DeepGEMM's kernels do not allocate; the truth "
        "adds them back. Narrower context step: a configuration whose step over cached context "
        "stayed narrower than serving's widest for the same question "
        "(NARROWER_CONTEXT_STEP says why); its rows are listed and left out of the "
        "per-architecture summary.",
        "",
        *table(c.rows),
        "",
        "Per configuration, over the starts that ran vLLM's memory profiling (vLLM alone, memest "
        "apply or measuring), as the pre-flight's question does, whose truth is the best figure "
        "any has (serving's peak, else the full-size step); memest plan starts, which load a "
        "persisted startup plan and skip profiling, in their own column:",
        "",
        "| configuration | architecture | in calibration | starts compared (truth from) | "
        "predicted KV GiB | worst error GiB | worst vLLM error GiB | worst plan-start error GiB "
        "| not asked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in s["configurations"].items():
        lines.append(
            f"| {name} | {v['architecture']} | {v['in_calibration']} | "
            f"{v['starts_compared']} of {v['starts']} ({v['truth_from']}) | "
            f"{_g(v['predicted_kv_bytes'])} | {_g(v['worst_error_bytes'], True)} | "
            f"{_g(v['worst_vllm_error_bytes'], True)} | "
            f"{_g(v['worst_plan_start_error_bytes'], True)} | {', '.join(v['not_asked']) or '–'} |"
        )
    within, archs = s["unseen_architectures_within_tolerance"], s["unseen_architectures"]
    lines += [
        "",
        f"Architectures the calibration lacks: {len(archs)} ({', '.join(archs) or 'none'}); "
        f"within ±{fmt_gib(TOLERANCE_BYTES, 2)} GiB on every start: {len(within)} "
        f"({', '.join(within) or 'none'}).",
    ]
    if any(not v["budget_matches"] for v in s["configurations"].values()):
        lines.append("A record's budget differs from the calibration GPU's: another GPU kind?")
    lines += ["", *(f"skipped: {k}" for k in c.skipped)]
    return "\n".join(lines).rstrip() + "\n"


def to_json(c: Check, command: str) -> dict[str, Any]:
    return {
        "command": command,
        "calibration": c.calibration,
        "rows": [asdict(r) for r in c.rows],
        "summary": summary(c.rows),
        "skipped": c.skipped,
        "predictions": {k: v.model_dump(mode="json") for k, v in c.predictions.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.jsonl of vllm_runs.py")
    parser.add_argument("--write", action="store_true", help="store unseen.json and unseen.md")
    args = parser.parse_args(argv)
    command = "python lab/preflight_check.py " + ("--write " if args.write else "")
    command += " ".join(_rel(p) for p in args.results)
    try:
        c = check(args.results)
    except MemestError as exc:
        print(f"preflight_check: {exc}", file=sys.stderr)
        return 2
    text = render(c, command)
    print(text, end="")
    if args.write:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "unseen.md").write_text(text)
        (OUT / "unseen.json").write_text(json.dumps(to_json(c, command), indent=1) + "\n")
    return 0


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


if __name__ == "__main__":
    sys.exit(main())
