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
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from lab.fit import calibrate  # noqa: E402
from lab.preflight_fit import FIRST_HELD_OUT_CALL, load_starts  # noqa: E402
from lab.standin_scratch import history_scratch_bytes  # noqa: E402
from lab.summarize_vllm import DIAGNOSTIC_STARTS  # noqa: E402
from lab.vllm_runs import CONFIGS  # noqa: E402
from lab.whatif_tools import grid_changes  # noqa: E402
from memest.errors import MemestError  # noqa: E402
from memest.estimate import what_if  # noqa: E402
from memest.estimate.activation import activation_shape  # noqa: E402
from memest.estimate.allocsim import round_size, segment_size  # noqa: E402
from memest.estimate.linear_prefill import prefill_backend  # noqa: E402
from memest.estimate.model_shape import model_shape  # noqa: E402
from memest.estimate.runner_buffers import ModelDims  # noqa: E402
from memest.estimate.sampler import prompt_logprobs_rows, serving_step_reserve_bytes  # noqa: E402
from memest.files import load_json_file, parse_json, read_regular_file  # noqa: E402
from memest.preflight import preflight, request_from  # noqa: E402
from memest.preflight.calibration import Calibration, load_calibration  # noqa: E402
from memest.schema import RunReport  # noqa: E402
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
    # "serving peak" (the largest of the full-size step, the step over cached context and the
    # full-batch step), "step",
    # "step-partial" (fewer than max_num_batched_tokens - 1) or "end"
    truth_from: str
    error_bytes: int
    vllm_kv_bytes: int | None = None
    vllm_error_bytes: int | None = None
    not_asked: list[str] = field(default_factory=list)
    budget_matches: bool = True  # the record's budget is the prediction's requested bytes
    # segments the step opened for the lab stand-ins' temporaries, added back to the truth
    standin_scratch_bytes: int = 0
    family_tested: str = ""  # family_of: what the configuration tests
    # of standin_scratch_bytes, the carry shim's silu_and_mul temporaries (shim_silu_scratch)
    shim_scratch_bytes: int = 0


@dataclass
class Check:
    calibration: str
    rows: list[Row]
    skipped: list[str]
    predictions: dict[str, PreflightResult]
    pairs: list[Pair] = field(default_factory=list)
    serve: list[ServeRow] = field(default_factory=list)


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
    path: Path,
    n: int,
    rec: Mapping[str, Any],
    result: PreflightResult,
    grid_seen: bool,
    family: str,
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
    batch = _int(rec, "batch_step_usage_minus_budget_bytes", where)
    if rec.get("batch_step_error"):
        return f"{path.name}:{n} {rec['config']}/{rec['mode']}: its full-batch step failed"
    scratch = 0
    if step is not None and context is not None:
        over, source = max(step, context), "serving peak"
        if context >= step:
            scratch = context_step_scratch(path, rec["config"])
    if step is not None and (batch is None or _narrow_batch(rec, cfg["mbt"])):
        # the full-batch step the record lacks, or one that scored fewer prompt rows than a
        # whole chunk: its first full-size step and what serving's widest step adds
        batch = max(batch or step, step + batch_step_unread(rec["config"]))
    if step is not None and batch is not None and batch - scratch > over - scratch:
        over, scratch = batch, 0
    if rec["config"] in NARROWER_CONTEXT_STEP:
        source = "narrower context step"
    assert over is not None
    numbered = re.match(r"results\.call(\d+)", path.name)
    ran_shim = numbered is None or int(numbered.group(1)) <= LAST_SHIM_SILU_CALL
    shim = 0
    if ran_shim and step is not None:
        # the peak is cumulative: the first step's segments stay reserved in the later steps
        shim = shim_silu_scratch(rec["config"], int(rec.get("step_tokens") or cfg["mbt"]))
    truth = kv - over + scratch + shim
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
        standin_scratch_bytes=scratch + shim,
        shim_scratch_bytes=shim,
        family_tested=family,
    )


#: The last call whose starts ran the carry shim's ``_C::silu_and_mul`` (two temporaries of the
#: result's size); later calls register lab/vllm_op_standins.py's in-place kernel.
LAST_SHIM_SILU_CALL = 51


def shim_silu_scratch(config: str, tokens: int) -> int:
    """Segments the carry shim's silu_and_mul opened in a MoE model's step of ``tokens``
    tokens for its two temporaries (F.silu(gate) and the product, each [tokens x top_k,
    moe_intermediate]), which vLLM's kernel does not allocate: call 35's Mixtral step history
    holds both (224 MiB at 2,047 tokens). 0 for a model without routed experts."""
    shape = model_shape(_model_config(CONFIGS[config]["model"]))
    if not shape.moe_layers or tokens <= 0:
        return 0
    temporary = round_size(tokens * shape.topk * shape.moe_intermediate * shape.dtype_bytes)
    return 2 * segment_size(temporary)


def _narrow_batch(rec: Mapping[str, Any], mbt: int) -> bool:
    """Whether the record's full-batch step scored fewer prompt rows than serving's widest
    prompt-logprobs chunk: calls 44-47 sent 7-token prompts (7 x max_num_seqs rows; on
    Llama-8B at 128 seqs, 896 rows of logits fit a freed forward block where 1,024 do not)."""
    seqs = rec.get("batch_step_seqs") or 0
    prompt = rec.get("batch_step_prompt_tokens") or 7
    return seqs * prompt < prompt_logprobs_rows(mbt)


def batch_step_unread(config: str) -> int:
    """What serving's full-batch step adds that a record from before the lab ran one never
    measured (memest.estimate.sampler's serving_step_reserve_bytes for the configuration: the
    prompt-logprobs chunk, a gated-delta-net layer's prefill): on the H200 the step added the
    derived amount over the first full-size step (Llama-8B 252 MiB, calls 48-49)."""
    cfg = CONFIGS[config]
    backend = (cfg.get("additional_config") or {}).get("gdn_prefill_backend")
    shape = activation_shape(model_shape(_model_config(cfg["model"])))
    return serving_step_reserve_bytes(
        shape, cfg["max_num_seqs"], cfg["mbt"], prefill_backend(backend)
    )


def context_step_scratch(path: Path, config: str) -> int:
    """Stand-in scratch (lab/standin_scratch.py) in the step over cached context of ``config``
    in the call of results file ``path``: from the call's step history of that configuration
    (every start of it in the call ran the same steps), 0 without one."""
    logs = path.parent / f"{path.stem.split('.')[-1]}-logs"
    found = sorted(logs.glob(f"{config}.*.context_step.pickle.gz"))
    return history_scratch_bytes(found[0]) if found else 0


def check(
    paths: Sequence[Path], cal: Calibration | None = None, *, leave_out: bool = False
) -> Check:
    """Every start record of ``paths`` whose configuration is in CONFIGS, predicted and compared;
    ``leave_out``: each by the calibration refit without what it shares with the fit
    (held_out_calibration), never by one that saw its grid or its drafter.

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
    families: dict[str, str] = {}
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
            version = rec.get("vllm_version")
            if version is not None and version != cal.vllm_version:  # another vLLM's start
                skipped.append(
                    f"{path.name}:{n} {name}/{rec['mode']}: vLLM {version} "
                    f"(the calibration's is {cal.vllm_version})"
                )
                continue
            if rec.get("kv_bytes") is None:  # a start that did not come up: nothing to compare
                skipped.append(
                    f"{path.name}:{n} {name}/{rec['mode']}: no kv_bytes (rc={rec.get('rc')})"
                )
                continue
            if name not in predictions:
                req = question(name)
                shipped = preflight(req, cal)
                families[name] = family_of(name, shipped)
                held = held_out_calibration(cal, req) if leave_out else cal
                predictions[name] = shipped if held is cal else preflight(req, held)
                grid_seen[name] = _grid_key(req) in seen
            row = _row(path, n, rec, predictions[name], grid_seen[name], families[name])
            if isinstance(row, str):
                skipped.append(row)
            else:
                rows.append(row)
    if not rows:
        raise InputError(
            f"no start of a CONFIGS configuration with kv_bytes in {', '.join(map(str, paths))}"
        )
    return Check(cal.label, rows, skipped, predictions)


# --------------------------------------------------------------------------- generalization
#: The issue's bar on the unsafe side: a prediction over the truth by more than this.
UNSAFE_BYTES = GIB // 10
#: Families whose model this check's pre-flight does not model (another module's work).
NOT_MODELLED: dict[str, str] = {}


def family_of(name: str, result: PreflightResult) -> str:
    """The family a configuration tests: serve defaults (vLLM's own max_num_seqs, tokens or
    utilization), the drafter, FP8, DSA, MLA by heads, MoE by expert count, hybrid, or dense."""
    cfg = CONFIGS[name]
    if cfg["util"] is None or (cfg["max_num_seqs"], cfg["mbt"]) == (1024, 8192):
        return "serve defaults"
    if result.speculative_method:
        return result.speculative_method
    fp8_weights = "quantization_config" in _model_config(cfg["model"])
    if cfg.get("kv_cache_dtype", "auto") != "auto" or fp8_weights:
        return "fp8"
    if result.model.startswith("DeepseekV32"):
        return "dsa"
    if result.family == "mla":
        return f"mla {_heads(name)} heads"
    if result.family == "moe":
        experts = int(_model_config(cfg["model"]).get("num_local_experts") or 0)
        return "moe few experts" if 0 < experts <= 16 else "moe many experts"
    return "hybrid" if result.model.startswith(("Gemma3", "Qwen3Next")) else "dense"


def _heads(name: str) -> int:
    cfg = _model_config(CONFIGS[name]["model"])
    return int(cfg.get("num_attention_heads") or 0)


def held_out_calibration(cal: Calibration, req: PreflightRequest) -> Calibration:
    """The calibration refit without what the question shares with it: its grid (a question
    one of the calibration's starts asked) and, for a drafter, every start of that drafter."""
    starts = [st for st in load_starts() if st.report_id in cal.starts]
    key = _grid_key(req)
    kept = [st for st in starts if _grid_key(st.request) != key]
    method = (req.speculative_config or {}).get("method")
    if method:  # a drafter's family: no start of the same drafter method
        kept = [st for st in kept if (st.request.speculative_config or {}).get("method") != method]
    if len(kept) == len(starts):
        return cal
    return calibrate(kept, cal).model_copy(update={"command": cal.command})


def family_summary(
    rows: Sequence[Row], serve: Sequence[ServeRow] = ()
) -> dict[str, dict[str, Any]]:
    """Per family, over each configuration's best-measured starts (and the `vllm serve`
    default-flags starts): the worst error, the most unsafe, and whether every one is within
    the bar (|error| <= 0.25 GiB, not over +0.1)."""
    by: dict[str, list[Row | ServeRow]] = {}
    for s in serve:
        by.setdefault("serve defaults", []).append(s)
    for rs in _by_config(rows).values():
        for r in _best(rs):
            if r.truth_from != "narrower context step":
                by.setdefault(r.family_tested, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for fam, rs in sorted(by.items()):
        worst = max((r.error_bytes for r in rs), key=abs)
        unsafe = max(r.error_bytes for r in rs)
        out[fam] = {
            "configurations": sorted({r.config for r in rs}),
            "starts": len(rs),
            "worst_error_bytes": worst,
            "most_unsafe_bytes": unsafe,
            "within_target": abs(worst) <= TOLERANCE_BYTES and unsafe <= UNSAFE_BYTES,
            "not_modelled": NOT_MODELLED.get(fam),
        }
    return out


def _by_config(rows: Sequence[Row]) -> dict[str, list[Row]]:
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.config, []).append(r)
    return by


#: `vllm serve` started with no scheduler flags at all (lab/serve_runs.py), memest apply: the
#: pre-flight's question is the model's config.json and nothing else.
SERVE_STARTS = {"V_llama8b_defaults": "llama8b"}


@dataclass
class ServeRow:
    config: str
    report: str
    predicted_kv_bytes: int
    truth_kv_bytes: int  # the start's accounting: KV - (usage - budget)

    @property
    def error_bytes(self) -> int:
        return self.predicted_kv_bytes - self.truth_kv_bytes


def serve_rows(paths: Sequence[Path]) -> list[ServeRow]:
    """The pre-flight with every flag unset against each `vllm serve` default-flags start among
    the calls of ``paths`` (its truth from its report's accounting)."""
    from memest.estimate import account

    out: list[ServeRow] = []
    for name, model in SERVE_STARTS.items():
        req = request_from({"model_config": _model_config(model), "gpu": GPU})
        predicted = preflight(req).kv_budget_bytes
        for path in paths:
            call = path.stem.split(".")[-1]
            for rep in sorted(path.parent.glob(f"{call}.{name}.apply.report.rank0.json")):
                acc = account(RunReport.model_validate_json(rep.read_text()))
                if acc.kv_cache_bytes is None or acc.usage_minus_budget_bytes is None:
                    continue
                truth = acc.kv_cache_bytes - acc.usage_minus_budget_bytes
                out.append(ServeRow(name, rep.name, predicted, truth))
    return out


@dataclass
class Pair:
    family: str
    config_from: str
    config_to: str
    report_from: str
    predicted_kv_bytes: int
    truth_kv_bytes: int

    @property
    def error_bytes(self) -> int:
        return self.predicted_kv_bytes - self.truth_kv_bytes


def _reports_by_config(paths: Sequence[Path]) -> dict[str, Path]:
    """One memest-apply report per configuration (the newest call's), from the results' folder."""
    found: dict[str, Path] = {}
    for path in paths:
        call = path.stem.split(".")[-1]
        for rep in sorted(path.parent.glob(f"{call}.*.apply.report.rank0.json")):
            found[rep.name.split(".")[1]] = rep
    return found


def with_decode_backend(report: RunReport, name: str) -> RunReport:
    """The report with the MLA decode backend its start ran (CONFIGS' attention_backend) where
    the plugin did not record it yet (reports before it did): the what-if moves TRITON_MLA's
    decode logits by it."""
    backend = CONFIGS[name].get("attention_backend")
    if report.config.mla_decode_backend is not None or backend is None:
        return report
    config = report.config.model_copy(update={"mla_decode_backend": backend})
    return report.model_copy(update={"config": config})


def _dims(report: RunReport, name: str) -> ModelDims:
    """The model's dimensions from its config.json (as `memest estimate --model-config` gives
    them): a what-if to a longer max_model_len needs its max_position_embeddings."""
    return ModelDims.from_report(report, _model_config(CONFIGS[name]["model"]))


def pairs(c: Check, paths: Sequence[Path]) -> list[Pair]:
    """The what-if between any two started grids of one family: from G's memest-apply report,
    the KV budget at G' against G''s truth (its best-measured starts' worst)."""
    # G's report and G''s start ran the same stand-ins: the what-if is held to G' as measured
    truths = {
        name: min(r.truth_kv_bytes - r.shim_scratch_bytes for r in _best(rs))
        for name, rs in _by_config(c.rows).items()
    }
    family = {r.config: r.family_tested for r in c.rows}
    model = {name: CONFIGS[name]["model"] for name in truths}
    out: list[Pair] = []
    for name, rep_path in sorted(_reports_by_config(paths).items()):
        if name not in truths:
            continue
        report = with_decode_backend(RunReport.model_validate_json(rep_path.read_text()), name)
        for other in sorted(truths):
            if other == name or model[other] != model[name] or family[other] == "hybrid":
                continue
            same = ("spec", "compilation")  # a what-if cannot drop G's capture-size cap
            if any(CONFIGS[other].get(k) != CONFIGS[name].get(k) for k in same):
                continue
            req, to = question(other), c.predictions[other]
            changes = grid_changes(report.config) | {
                "max_num_seqs": to.max_num_seqs,
                "max_num_batched_tokens": to.max_num_batched_tokens,
                "max_model_len": req.max_model_len,
                "gpu_memory_utilization": to.gpu_memory_utilization,
            }
            try:
                w = what_if(report, changes, dims=_dims(report, name))
            except MemestError:
                continue
            if w.kv_budget_bytes_to is None:
                continue
            out.append(
                Pair(family[name], name, other, rep_path.name, w.kv_budget_bytes_to, truths[other])
            )
    return out


def serve_pairs(c: Check, paths: Sequence[Path]) -> list[Pair]:
    """The what-if from each memest-apply report of a `vllm serve` default-flags model to those
    defaults (the pre-flight's resolution of a question with no flag), against their starts."""
    out: list[Pair] = []
    for name, model in SERVE_STARTS.items():
        truths = [s.truth_kv_bytes for s in c.serve if s.config == name]
        if not truths:
            continue
        to = preflight(request_from({"model_config": _model_config(model), "gpu": GPU}))
        grid = {
            "max_num_seqs": to.max_num_seqs,
            "max_num_batched_tokens": to.max_num_batched_tokens,
            "max_model_len": to.max_model_len,
            "gpu_memory_utilization": to.gpu_memory_utilization,
        }
        for other, rep_path in sorted(_reports_by_config(paths).items()):
            cfg = CONFIGS.get(other)
            if cfg is None or Path(cfg["model"]).name != model:
                continue
            if cfg.get("spec") or cfg.get("compilation"):
                continue
            report = RunReport.model_validate_json(rep_path.read_text())
            try:
                w = what_if(report, grid_changes(report.config) | grid, dims=_dims(report, other))
            except MemestError as exc:  # a report the what-if cannot start from: say which
                c.skipped.append(f"{rep_path.name}: no what-if to serve defaults ({exc})")
                continue
            if w.kv_budget_bytes_to is not None:
                out.append(
                    Pair(
                        "serve defaults",
                        other,
                        name,
                        rep_path.name,
                        w.kv_budget_bytes_to,
                        min(truths),
                    )
                )
    return out


def pair_table(ps: Sequence[Pair]) -> list[str]:
    out = [
        "| family | G (its memest-apply report) | G' | predicted KV GiB | truth GiB | error GiB |",
        "|---|---|---|---|---|---|",
    ]
    for p in ps:
        out.append(
            f"| {p.family} | {p.config_from} ({p.report_from}) | {p.config_to} | "
            f"{_g(p.predicted_kv_bytes)} | {_g(p.truth_kv_bytes)} | {_g(p.error_bytes, True)} |"
        )
    return out


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
        "(usage − budget), usage at serving's peak (the largest of the first full-size step, "
        "the step over cached context and the full-batch step), else at the first full-size "
        "step (step), else at the end of init plus the profile pass's activation peak (end). "
        "A record from before the lab ran the full-batch step (calls before 48) takes that "
        "step as its first full-size step plus what memest.estimate.sampler derives it adds "
        "(the prompt-logprobs chunk, a gated-delta-net layer's prefill; on the H200 the step "
        "added the derived 252 MiB on Llama-8B, calls 48-49); error = "
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
    lines += [
        "",
        "## Leave the family out",
        "",
        "Each configuration is predicted by a calibration without what it shares with the fit: "
        "the shipped one (calls 1-10, Llama-3-8B shape) for every other family; refit without "
        "its grid where one of the calibration's starts asked its question, and without every "
        "start of its drafter for a drafter's. Target: within ±0.25 GiB per rank and not over +0.1 "
        "(the unsafe side).",
        "",
        "| family | configurations | starts | worst error GiB | most unsafe GiB | within target |",
        "|---|---|---|---|---|---|",
    ]
    for fam, v in family_summary(c.rows, c.serve).items():
        ok = "yes" if v["within_target"] else "no"
        if v["not_modelled"]:
            ok += f" (not modelled here: {v['not_modelled']})"
        lines.append(
            f"| {fam} | {', '.join(v['configurations'])} | {v['starts']} | "
            f"{_g(v['worst_error_bytes'], True)} | {_g(v['most_unsafe_bytes'], True)} | {ok} |"
        )
    if c.serve:
        lines += [
            "",
            "`vllm serve` with no flags (lab/serve_runs.py V_llama8b_defaults: 1,024 seqs, 8,192 "
            "tokens, max_model_len 8,192, utilization 0.92), against `memest preflight "
            "--model-config` with no flag either:",
            "",
            "| start | predicted KV GiB | truth GiB | error GiB |",
            "|---|---|---|---|",
            *(
                f"| {s.report} | {_g(s.predicted_kv_bytes)} | {_g(s.truth_kv_bytes)} | "
                f"{_g(s.error_bytes, True)} |"
                for s in c.serve
            ),
        ]
    if c.pairs:
        worst = max((abs(p.error_bytes) for p in c.pairs), default=0)
        lines += [
            "",
            "## The what-if between started grids of one family",
            "",
            "From each configuration's memest-apply report (G), `what_if` predicts the KV budget "
            "at every other started grid of the same model (G'); truth = G''s (the smallest of "
            "its best-measured starts'), as measured: G's report and G''s start ran the same "
            "stand-ins, so the carry shim's silu_and_mul temporaries stay in both. An MLA "
            "report from before the plugin recorded its decode backend takes the one its start "
            f"ran (CONFIGS). Target: within ±0.1 GiB. Worst: {fmt_gib(worst)} GiB.",
            "",
            *pair_table(c.pairs),
        ]
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
        "families": family_summary(c.rows, c.serve),
        "serve_defaults_starts": [asdict(s) | {"error_bytes": s.error_bytes} for s in c.serve],
        "pairs": [asdict(p) | {"error_bytes": p.error_bytes} for p in c.pairs],
        "skipped": c.skipped,
        "predictions": {k: v.model_dump(mode="json") for k, v in c.predictions.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "results",
        nargs="*",
        type=Path,
        help="results.jsonl of vllm_runs.py (default: every call the calibration held out)",
    )
    parser.add_argument("--write", action="store_true", help="store unseen.json and unseen.md")
    args = parser.parse_args(argv)
    command = "python lab/preflight_check.py" + (" --write" if args.write else "")
    command += "".join(f" {_rel(p)}" for p in args.results)
    paths = args.results or held_out_results()
    try:
        c = check(paths, leave_out=True)
        c.pairs = pairs(c, paths)
        c.serve = serve_rows(paths)
        c.pairs += serve_pairs(c, paths)
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


def held_out_results() -> list[Path]:
    """Every results file of a call the calibration held out (lab/preflight_fit.py), in order."""
    raw = ROOT / "reports/vllm/raw"
    found = [(int(p.stem.split("call")[-1]), p) for p in raw.glob("results.call*.jsonl")]
    return [p for n, p in sorted(found) if n >= FIRST_HELD_OUT_CALL]


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


if __name__ == "__main__":
    sys.exit(main())
