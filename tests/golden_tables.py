"""Golden outputs of every table surface: what `memest report`, `analyze`, `check`, `plan`, the
accounting table, and the service's compare, history and run views print for real reports.

``outputs(tmp)`` renders them all; tests/integration/service/test_golden_tables.py compares them
with the files under tests/data/golden_tables/, so a refactor of the reporters that changes a
single printed byte fails. Like every golden file (tests/golden.py) they detect change, not
truth. After an intended change, regenerate with the reason

    MEMEST_WRITE_GOLDEN='why the tables change' PYTHONPATH=$PWD:$PWD/instrumentation \
        python -m tests.golden_tables

which lists every changed file under that reason in tests/data/golden/CHANGES.md; read the diff
before committing both.

The reports: every one under tests/data/reports and a handful of real starts under
tests/data/starts (copies of reports/vllm/raw: an old-style note, a start with only the measured record, MLA, MoE, a fault-injected start, a
default start and its repeat, a plan-record-only start), plus the service's published demo runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.golden import record_changes, write, write_reason

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_tables"
DATA = ROOT / "tests" / "data" / "reports"
STARTS = ROOT / "tests" / "data" / "starts"

#: The real starts under tests/data/starts the golden outputs cover (names without
#: .report.rank0.json).
START_RUNS = (
    "A_llama8b_s128_t4096.fault",
    "call4.C_llama8b_eagle3k3_s64_t4096.plandiag",
    "call11.W1_llama8b_s32_t4096.apply",
    "call12.L_dsv2lite8l_s64_t2048.apply-hist",
    "call12.M_qwen3moe8l_s64_t2048.apply-hist",
    "call16.A_llama8b_s128_t4096.default",
    "call16.A_llama8b_s128_t4096.default.2",
    "call22.S_llama8b_s128_t4096.apply",
)

#: Comparisons A → B (by golden name).
PAIRS = (
    ("call5.B_llama8b_s32_t2048.enable", "call6.B_llama8b_s32_t2048.apply"),
    ("call4.C_llama8b_eagle3k3_s64_t4096.enable", "call6.C_llama8b_eagle3k3_s64_t4096.apply"),
    ("call6.D_llama8b_s128_t4096_u070.apply", "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply"),
    ("call16.A_llama8b_s128_t4096.default", "call16.A_llama8b_s128_t4096.default.2"),
    ("call11.W1_llama8b_s32_t4096.apply", "call6.B_llama8b_s32_t2048.apply"),
    ("call12.L_dsv2lite8l_s64_t2048.apply-hist", "call12.M_qwen3moe8l_s64_t2048.apply-hist"),
)

#: Runs whose dashboard run page is kept too (the page draws the whole GPU with who sized it).
RUN_PAGES = (
    "call5.B_llama8b_s32_t2048.enable",
    "call6.B_llama8b_s32_t2048.apply",
    "A_llama8b_s128_t4096.fault",
)

#: `memest check` limits wide enough to hold, so the lines name the figures (and the estimator).
CHECK_ARGS = (
    "--max-graph-pool",
    "100GiB",
    "--max-estimate-error",
    "100GiB",
    "--min-kv-tokens",
    "0",
)


def report_paths() -> dict[str, Path]:
    """Golden name -> report file."""
    out = {p.name.removesuffix(".report.rank0.json"): p for p in sorted(DATA.glob("*.json"))}
    out.update({name: STARTS / f"{name}.report.rank0.json" for name in START_RUNS})
    return out


@contextlib.contextmanager
def _captured() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def _cli(args: list[str]) -> str:
    from memest.cli import main

    with _captured() as buf:
        code = main(args)
    return f"{buf.getvalue()}[exit {code}]\n"


def _report_files(args: list[str], out: Path) -> dict[str, str]:
    """`memest report ARGS --html`: the markdown and the standalone HTML it writes."""
    if out.exists():
        shutil.rmtree(out)
    _cli([*args, "--html", "--out", str(out)])
    return {p.suffix[1:]: p.read_text() for p in sorted(out.iterdir()) if p.suffix != ".svg"}


def _per_report(name: str, path: Path, tmp: Path) -> dict[str, str]:
    from memest.cli._reports import load_report
    from memest.estimate import account
    from memest.reporters.breakdown import render_markdown, render_text
    from memest.reporters.estimate import render_accounting

    out = {f"run/{name}.{k}": v for k, v in _report_files(["report", str(path)], tmp).items()}
    report = load_report(path)
    if report.breakdown is not None:
        out[f"analyze/{name}.md"] = render_markdown(report.breakdown, phases=report.phases)
        out[f"analyze/{name}.txt"] = render_text(report.breakdown, "MiB", report.phases)
    out[f"accounting/{name}.txt"] = render_accounting(account(report))
    out[f"check/{name}.txt"] = _cli(["check", str(path), *CHECK_ARGS])
    ranks = tmp / "ranks"
    ranks.mkdir(exist_ok=True)
    shutil.copy(path, ranks / "report.rank0.json")
    out[f"ranks/{name}.md"] = _cli(["analyze", "--run", str(ranks)])
    return out


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _service(paths: dict[str, Path], tmp: Path) -> dict[str, str]:
    """The service's compare, history and run views (JSON and pages) of the same reports."""
    from fastapi.testclient import TestClient

    from memest.service import create_app
    from memest.service.config import Settings

    token = "golden-token"
    settings = Settings(database_url=f"sqlite:///{tmp / 'golden.db'}", write_token=token)  # type: ignore[call-arg]
    out: dict[str, str] = {}
    with TestClient(create_app(settings)) as client:
        runs: dict[str, dict[str, Any]] = {}
        for name, path in paths.items():
            doc = json.loads(path.read_text())
            auth = {"Authorization": f"Bearer {token}"}
            resp = client.post("/api/v1/reports", json=doc, headers=auth)
            assert resp.status_code == 201, (name, resp.text)
            runs[name] = doc
        for name, doc in runs.items():
            run = client.get(f"/api/v1/runs/{quote(doc['run_id'], safe='')}").json()
            out[f"service/run/{name}.json"] = _json(run["facts"])
            if name in RUN_PAGES:
                page = f"/models/{quote(run['run']['model'], safe='')}"
                params = {"run": doc["run_id"]}
                out[f"service/run/{name}.html"] = client.get(page, params=params).text
        for a, b in PAIRS:
            q = {"a": runs[a]["run_id"], "b": runs[b]["run_id"]}
            out[f"service/compare/{a}--{b}.json"] = _json(
                client.get("/api/v1/compare", params=q).json()
            )
            out[f"service/compare/{a}--{b}.html"] = client.get("/compare", params=q).text
        models = sorted({m["model"] for m in client.get("/api/v1/models").json()["data"]})
        for model in models:
            slug = model.replace("/", "_")
            hist = client.get("/api/v1/history", params={"model": model}).json()
            out[f"service/history/{slug}.json"] = _json(hist)
            out[f"service/history/{slug}.html"] = client.get(
                f"/history/{quote(model, safe='')}"
            ).text
    return out


def outputs(tmp: Path) -> dict[str, str]:
    """Every golden output, by its path under tests/data/golden_tables."""
    paths = report_paths()
    out: dict[str, str] = {}
    for name, path in paths.items():
        out.update(_per_report(name, path, tmp / "report"))
    for a, b in PAIRS:
        files = _report_files(["report", str(paths[a]), str(paths[b])], tmp / "compare")
        out.update({f"compare/{a}--{b}.{k}": v for k, v in files.items()})
    out["plan/llama8b-s128-t4096.txt"] = _cli(
        ["plan", "--gpu", "h200", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096"]
    )
    out.update(_service(paths, tmp))
    return out


def main() -> None:
    import tempfile

    reason = write_reason()
    if reason is None:
        raise SystemExit("set MEMEST_WRITE_GOLDEN='<why the tables change>' to regenerate")
    with tempfile.TemporaryDirectory() as tmp:
        produced = outputs(Path(tmp))
    gone = [
        p
        for p in GOLDEN.rglob("*")
        if p.is_file() and p.relative_to(GOLDEN).as_posix() not in produced
    ]
    for path in gone:
        path.unlink()
    record_changes(reason, gone)
    for rel, text in produced.items():
        write(GOLDEN / rel, text, reason)
    size = sum(len(t.encode()) for t in produced.values())
    print(f"{len(produced)} files, {size} bytes under {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()
